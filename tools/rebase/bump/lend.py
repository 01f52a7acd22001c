"""Every line's work is lent: at a stop, the same patch as another line keeps it.

The lines keep one series on three bases (release, upstream ``main``, upstream ``dev``); a
conflict one line meets on a new base is often one another line solved already (a sync of
``main`` into ``dev`` brings ``main``'s code, which the main line's patches are written against).
At a stop on patch ``N`` each other line's patch with the same ``Patch-Name:`` is tried on every
conflicted file, one file at a time: ``git apply --3way`` of that file's part of the patch onto the
stop's upstream side (``HEAD``), in a scratch index, so neither the work tree nor the merge in
progress is touched. The three-way merge needs the blobs the other patch was made against: they
are read from that line's own work repo when it has one (``apply --line L`` made it), else git
applies the hunks directly where their context still matches. A file counts as resolved only
when it applies without a conflict.

A line whose version resolves every conflicted file is a candidate; ``bump --continue --take-from
LINE`` writes its files into the work tree, stages them and continues, so the resolution is
recorded (rerere and the edits of clean merges) like one made by hand. Partial candidates are
named at the stop too, with the files they resolve. Only committed files are read (patches named
in a line's series), never run; a candidate is a suggestion, checked by the post-merge lint and the
patch's ``Tests:`` like any resolution.
"""

import os
import tempfile
from pathlib import Path

from tools.rebase.bump.commits import _unmerged
from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import git, git_proc
from tools.rebase.git.paths import LINES_DIR
from tools.rebase.git.safefs import write_file
from tools.rebase.stack.series import parse_patch, read_series

RELEASE = "release"  # how the release line (the checkout's top level) is named at a stop


def line_label(layout) -> str:
    return RELEASE if layout.line is None else layout.line


def other_lines(home, own) -> list:
    """The Layouts of every line of ``home``'s checkout but ``own`` (a line name, None for release):
    the release line, then ``lines/*`` in name order (real folders holding a series only)."""
    found = [] if own is None else [home.for_line(None)]
    folder = home.root / LINES_DIR
    if folder.is_dir() and not folder.is_symlink():
        for entry in sorted(folder.iterdir()):
            if entry.name != own and entry.is_dir() and not entry.is_symlink() \
                    and (entry / "patches" / "series").is_file():
                found.append(home.for_line(entry.name))
    return found


def layout_for(home, label: str):
    """The Layout ``--take-from LABEL`` names (``release``: the top level unless a line of that name exists)."""
    if label == RELEASE and not (home.root / LINES_DIR / RELEASE).is_dir():
        return home.for_line(None)
    return home.for_line(label)


def patch_file(layout, name: str):
    """The patch file of ``layout``'s series whose ``Patch-Name:`` is ``name``, or None."""
    if not layout.series.is_file():
        return None
    for entry in read_series(layout.series).names:
        path = layout.patches / entry
        if path.is_file() and not path.is_symlink():
            try:
                if parse_patch(path).name == name:
                    return path
            except RebaseError:
                continue  # a damaged patch of another line lends nothing; `check` reports it there
    return None


def _objects_of(layout) -> dict:
    """Environment that lets git read the other line's work repo objects (its patches' blobs)."""
    objects = layout.work / ".git" / "objects"
    if objects.is_dir() and not objects.is_symlink() and not (layout.work / ".git").is_symlink():
        return {"GIT_ALTERNATE_OBJECT_DIRECTORIES": str(objects)}
    return {}


def try_patch(work: Path, patch: Path, files, extra_env=None) -> dict:
    """``{path: blob}`` for each of ``files`` that ``patch``'s part for it applies to ``HEAD``'s
    version without a conflict (three-way where the blobs are known), in a scratch index."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="rebase-lend-") as tmp:
        for path in files:
            env = {"GIT_INDEX_FILE": os.path.join(tmp, "index"), **(extra_env or {})}
            git("read-tree", "HEAD", cwd=work, env=env)
            proc = git_proc("apply", "--cached", "--3way", f"--include={path}", str(patch), cwd=work, env=env)
            if proc.returncode != 0:
                continue
            staged = git("ls-files", "-s", "--", path, cwd=work, env=env).split()
            before = git_proc("rev-parse", "--verify", "-q", f"HEAD:{path}", cwd=work).stdout.strip()
            if len(staged) >= 4 and staged[2] == "0" and staged[1] != before:
                # the result may be a blob only the other line's repo holds: copy it into this one
                data = git("cat-file", "blob", staged[1], cwd=work, env=env, binary=True)
                out[path] = git("hash-object", "-w", "--stdin", cwd=work, input=data).strip()
    return out


def candidates(home, own, work: Path, name: str, files) -> list:
    """``[{"line", "files": {path: blob}, "missing": [paths]}]``: each other line's version of
    patch ``name`` tried on the conflicted ``files`` (lines without that patch are left out)."""
    found = []
    for other in other_lines(home, own):
        patch = patch_file(other, name)
        if patch is None:
            continue
        resolved = try_patch(work, patch, files, _objects_of(other))
        found.append({"line": line_label(other), "files": resolved,
                      "missing": sorted(set(files) - set(resolved))})
    return found


def summary_lines(lent: list, line_flag: str) -> list:
    """What the stop message says of the other lines' versions."""
    out = []
    for c in lent:
        if not c["files"]:
            continue
        if not c["missing"]:
            out.append(f"line {c['line']}'s version of this patch applies to every conflicted file: take it with "
                       f"`python -m tools.rebase bump{line_flag} --continue --take-from {c['line']}`")
        else:
            out.append(f"line {c['line']}'s version of this patch applies to {', '.join(sorted(c['files']))} "
                       f"but not to {', '.join(c['missing'])}")
    return out


def take(work: Path, home, own, name: str, label: str) -> list:
    """Write line ``label``'s version of patch ``name`` over the conflicted files of the stop in
    ``work`` and stage them; return the paths. Refused unless it resolves every one."""
    other = layout_for(home, label)
    if other.line == own:
        raise RebaseError(f"--take-from {label}: that is the line being bumped")
    patch = patch_file(other, name)
    if patch is None:
        raise RebaseError(f"--take-from {label}: line {label} has no patch named {name!r} "
                          f"(in {other.rel(other.series)})")
    files = sorted(_unmerged(work))
    if not files:
        raise RebaseError(f"--take-from {label}: no conflicted file is left in {work}")
    resolved = try_patch(work, patch, files, _objects_of(other))
    missing = sorted(set(files) - set(resolved))
    if missing:
        raise RebaseError(f"--take-from {label}: {other.rel(patch)} does not apply without a conflict to "
                          f"{', '.join(missing)}; resolve by hand (its version is a reference there)")
    for path, blob in sorted(resolved.items()):
        target = work / path
        if target.is_symlink():
            raise RebaseError(f"{target}: --take-from does not write through a link")
        write_file(work, target, git("cat-file", "blob", blob, cwd=work, binary=True))
        git("add", "--", path, cwd=work)
    return sorted(resolved)
