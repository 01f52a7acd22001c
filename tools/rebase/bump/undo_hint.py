"""After a finished bump: how to take it back, said only when it is true.

A finished bump leaves no journal (``bump --abort`` is for a bump in progress), but what it
changed in the checkout -- the pin, ``patches/``, the report and the README table -- is tracked by
git. When the bump's backup of those files equals the checkout's last commit, ``git checkout``
of them (and ``git clean`` of the files it added) followed by ``apply`` gives the old stack
back exactly; otherwise the hint says why git cannot.
"""

from pathlib import Path

from tools.rebase.bump import journal as jr
from tools.rebase.git.gitcmd import git, git_proc


def _backed_up(layout) -> dict:
    """``{checkout-relative path: backup file}`` of the tracked files the bump may have changed."""
    backup = jr.backup_dir(layout)
    out = {}
    for name, live in (("upstream.toml", layout.pin), ("patches", layout.patches),
                       ("REBASE_REPORT.md", layout.report_md), ("REBASE_REPORT.json", layout.report_json),
                       ("README.md", layout.readme)):
        saved = backup / name
        if saved.is_dir() and not saved.is_symlink():
            for path in sorted(saved.rglob("*")):
                if path.is_file() and not path.is_symlink():
                    out[f"{layout.rel(live)}/{path.relative_to(saved).as_posix()}"] = path
        elif saved.is_file() and not saved.is_symlink():
            out[layout.rel(live)] = saved
    return out


def undo_hint(layout) -> str:
    """One line for the end of a finished bump (call it while the bump's backup still exists)."""
    paths = [layout.rel(p) for p in (layout.pin, layout.patches, layout.readme, layout.report_md,
                                     layout.report_json)]
    root = layout.root
    if git_proc("rev-parse", "--verify", "--quiet", "HEAD", cwd=root).returncode != 0:
        return ("to undo it: this checkout has no git commit to restore the old pin and patches/ from; "
                "keep a copy before a bump you may take back")
    saved = _backed_up(layout)
    listed = git("ls-tree", "-r", "HEAD", "--", *paths, cwd=root)
    committed = {line.split("\t", 1)[1]: line.split()[2] for line in listed.splitlines() if "\t" in line}
    names = list(saved)
    hashed = git("hash-object", "--no-filters", "--stdin-paths", cwd=root,
                 input="".join(f"{Path(saved[n]).resolve()}\n" for n in names)).split() if names else []
    if dict(zip(names, hashed)) != committed:
        return (f"to undo it: {', '.join(paths)} held changes not committed before the bump, so git "
                f"cannot give that state back exactly; `git diff HEAD -- {' '.join(paths)}` shows the "
                f"bump's changes together with them")
    shown = " ".join(p for p in paths if p in committed or any(k.startswith(p + "/") for k in committed))
    # checkout puts back what was committed; clean removes what the bump added (a new patch file,
    # a first report): nothing else was untracked there, or the backup would differ from HEAD.
    return (f"to undo it (before committing it): git checkout HEAD -- {shown} && git clean -fdq -- "
            f"{' '.join(paths)}, then python -m tools.rebase apply{layout.line_flag}")
