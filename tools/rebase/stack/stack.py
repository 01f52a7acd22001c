"""Build the patch stack as commits (``git am``) and turn commits back into patch files.

Both directions are hermetic: fixed committer identity and dates on the way in, pinned
format-patch flags on the way out, so ids and bytes are reproducible on any machine.
"""

import contextlib
import functools
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

from tools.rebase.git import prefetch
from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import git, git_proc, is_full_id, rev_parse
from tools.rebase.stack.series import SLUG, parse_trailers
from tools.rebase.git.paths import EXPORT_ASIDE
from tools.rebase.git.safefs import copy_entry, create_new

MBOX_FROM = b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
FORMAT_PATCH_FLAGS = (
    "--zero-commit", "--no-signature", "--full-index", "--keep-subject", "--no-stat",
    "--no-notes", "--find-renames=50%", "--no-binary", "--stdout",
)


def stack_digest(pin_bytes: bytes, series_bytes: bytes, patch_bytes: list) -> str:
    from tools.rebase.stack.pin import digested_pin_bytes

    h = hashlib.sha256()
    for chunk in (digested_pin_bytes(pin_bytes), series_bytes, *patch_bytes):
        h.update(len(chunk).to_bytes(8, "big"))
        h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def scratch_worktree(work: Path, start: str):
    """A detached temporary worktree of ``work`` at ``start``; always removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="build-", dir=work.parent))
    shutil.rmtree(tmp)
    git("worktree", "add", "-q", "--detach", tmp, start, cwd=work)
    try:
        yield tmp
    finally:
        git_proc("am", "--abort", cwd=tmp) if (tmp / ".git").exists() else None
        git_proc("worktree", "remove", "--force", tmp, cwd=work)
        shutil.rmtree(tmp, ignore_errors=True)
        git_proc("worktree", "prune", cwd=work)


def am_one(tree: Path, patch: Path, three_way: bool) -> str:
    """Apply one patch as one commit on HEAD of ``tree``; return the new commit id."""
    before = rev_parse(tree, "HEAD")
    args = ["am", "-q", "-k", "--keep-cr", "--committer-date-is-author-date"]
    if three_way:
        args.append("-3")
    proc = git_proc(*args, str(patch), cwd=tree)
    after = rev_parse(tree, "HEAD")
    if proc.returncode != 0:
        detail = _am_detail(proc.stdout + proc.stderr)
        git_proc("am", "--abort", cwd=tree)
        mode = "with a 3-way merge" if three_way else "exactly (no fuzz, no 3-way merge)"
        raise RebaseError(f"{patch.name} does not apply {mode}:\n{detail}")
    if after == before:
        raise RebaseError(
            f"{patch.name} made no commit: its change is already in the tree below it "
            f"(git said: {(proc.stdout + proc.stderr).strip() or 'nothing'})"
        )
    return after


_AM_RESUME_ADVICE = ("hint:", "When you have resolved this problem", "If you prefer to skip this patch",
                     "To restore the original branch", "Use 'git am --show-current-patch")


def _am_detail(output: str) -> str:
    """git am's diagnosis without its resume advice: that names a scratch worktree which is gone
    by the time the user reads it."""
    lines = [line for line in output.strip().splitlines() if not line.lstrip().startswith(_AM_RESUME_ADVICE)]
    return "\n".join(lines).strip() or "(git am gave no reason)"


def build(work: Path, base: str, patches: list, three_way: bool = True) -> list:
    """Apply ``patches`` on ``base`` in a scratch worktree; return the commit ids (base excluded).

    Nothing in ``work``'s checkout or branches changes: on failure only loose objects remain.
    """
    commits = []
    with scratch_worktree(work, base) as tree:
        for patch in patches:
            commits.append(am_one(tree, Path(patch).resolve(), three_way))
    return commits


def format_commit(repo: Path, commit: str) -> bytes:
    out = git("format-patch", *FORMAT_PATCH_FLAGS, "-1", commit, cwd=repo, binary=True)
    if not out.endswith(b"\n"):
        out += b"\n"
    return out


def commit_message(repo: Path, commit: str) -> str:
    return git("show", "-s", "--format=%B", commit, cwd=repo)


class ChainCommit(NamedTuple):
    commit: str
    parents: tuple
    committer_name: str
    committer_email: str
    author_date: str  # raw: "<seconds> <zone>"
    committer_date: str
    message: str
    raw: str  # ``--raw`` lines: file modes and blob ids


def chain_log(repo: Path, base: str, tip: str) -> list:
    """``[ChainCommit]`` of base..tip, oldest first, from one ``git log``. Between full commit
    ids the answer cannot change (ids name their whole history), so a bump's repeated questions
    about one range (names, committer checks, the export's checks) cost one git call."""
    if is_full_id(base) and is_full_id(tip):
        return list(_chain_log_cached(str(repo), base, tip))
    return _chain_log(repo, base, tip)


def _chain_log(repo, base: str, tip: str) -> list:
    out = git("log", "--reverse", "--date=raw", "--no-renames", "--raw", "--no-abbrev",
              "--format=%x01%H%x00%P%x00%cn%x00%ce%x00%ad%x00%cd%x00%B%x02", f"{base}..{tip}", cwd=repo)
    rows = []
    for chunk in out.split("\x01")[1:]:
        head, _, raw = chunk.partition("\x02")
        sha, parents, cn, ce, ad, cd, message = head.split("\x00", 6)
        rows.append(ChainCommit(sha, tuple(parents.split()), cn, ce, ad, cd, message.rstrip("\n"), raw))
    return rows


@functools.lru_cache(maxsize=32)
def _chain_log_cached(repo: str, base: str, tip: str) -> tuple:
    return tuple(_chain_log(repo, base, tip))


def export_range(repo: Path, base: str, tip: str) -> list:
    """Return ``[(file_name, bytes)]`` for base..tip in order; names come from Patch-Name."""
    commits = _linear_range(repo, base, tip)
    names, seen = [], {}
    for commit, message in commits:
        subject = message.splitlines()[0] if message else ""
        found = parse_trailers(message).get("Patch-Name", [])
        if not found:
            raise RebaseError(
                f"commit {commit[:12]} ({subject!r}) has no 'Patch-Name:' trailer; add one "
                f"(git commit --amend) so its patch file keeps a stable name"
            )
        name = found[0]
        if not SLUG.match(name):
            raise RebaseError(
                f"commit {commit[:12]} ({subject!r}): Patch-Name {name!r} must be lowercase "
                f"letters, digits, '.' and '-'"
            )
        if name in seen:
            raise RebaseError(f"commits {seen[name][:12]} and {commit[:12]} share Patch-Name {name!r}")
        seen[name] = commit
        names.append(name)
    bodies = _format_range(repo, base, tip, len(commits)) or [format_commit(repo, c) for c, _ in commits]
    return [(f"{number:04d}-{name}.patch", data)
            for number, (name, data) in enumerate(zip(names, bodies), start=1)]


def _linear_range(repo: Path, base: str, tip: str) -> list:
    """``[(commit, message)]`` of base..tip, oldest first, after the checks an export needs: no
    merge commit, ``base`` an ancestor of ``tip``, no symlink. One ``git log`` answers all of
    them (``chain_log``: parents, messages, raw file modes); merge-base only when ids cannot tell."""
    rows = [(c.commit, c.parents, c.message, c.raw) for c in chain_log(repo, base, tip)]
    merges = [commit for commit, parents, _, _ in reversed(rows) if len(parents) > 1]  # newest first
    if merges:
        raise RebaseError(f"the stack must be linear, but {merges[0][:12]} is a merge commit")
    # Linear range: base is an ancestor of tip exactly when the oldest commit's parent is base
    # (or the range is empty and tip is base).
    if is_full_id(base) and (rows or is_full_id(tip)):
        ancestor = rows[0][1] == (base,) if rows else tip == base
    else:
        ancestor = git_proc("merge-base", "--is-ancestor", base, tip, cwd=repo).returncode == 0
    if not ancestor:
        raise RebaseError(f"{tip[:12]} is not built on the pinned base {base[:12]}")
    for commit, _, _, raw in rows:
        _refuse_symlink_lines(commit, raw)
    return [(commit, message) for commit, _, message, _ in rows]


def _refuse_symlink_lines(commit: str, raw: str) -> None:
    """A commit that adds or changes a symlink cannot become a patch (the package has none)."""
    for line in raw.splitlines():
        if line.startswith(":") and line.split(" ", 2)[1] == "120000":
            raise RebaseError(f"commit {commit[:12]} adds a symlink, {line.split(chr(9), 1)[1]!r}; the "
                              f"package must not contain symlinks: replace it with a file. Nothing was written.")


def _format_patch_stream(repo: Path, base: str, tip: str) -> bytes:
    return git("format-patch", *FORMAT_PATCH_FLAGS, f"{base}..{tip}", cwd=repo, binary=True)


def prefetch_export(repo: Path, base: str, tip: str) -> None:
    """Run the export's format-patch of ``base..tip`` in the background for ``export_range``."""
    if prefetch.immutable(base, tip):
        prefetch.start(("format-patch", str(repo), base, tip), _format_patch_stream, repo, base, tip)


def _format_range(repo: Path, base: str, tip: str, count: int):
    """format-patch the whole range in one call and split it per commit (None if it does not split
    into ``count`` messages, e.g. a message quoting a From line: then format commit by commit)."""
    found, stream = prefetch.take(("format-patch", str(repo), base, tip))
    if not found:
        stream = _format_patch_stream(repo, base, tip)
    parts = stream.split(MBOX_FROM)
    if parts[0] != b"" or len(parts) - 1 != count:
        return None
    out = []
    for number, body in enumerate(parts[1:], start=1):
        if number < count:  # the stream separates messages with one blank line
            if not body.endswith(b"\n\n"):
                return None
            body = body[:-1]
        data = MBOX_FROM + body
        out.append(data if data.endswith(b"\n") else data + b"\n")
    return out


def _owned_by_export(name: str) -> bool:
    return name == "series" or name.endswith(".patch")


def _holds_exactly(patches_dir: Path, wanted: dict) -> bool:
    present = [p for p in patches_dir.iterdir() if _owned_by_export(p.name)]
    if {p.name for p in present} != set(wanted):
        return False
    return all(not p.is_symlink() and p.is_file() and p.read_bytes() == wanted[p.name] for p in present)


def write_patch_dir(patches_dir: Path, files: list, series_text: str) -> bool:
    """Make ``patches_dir`` hold exactly ``files`` (+ series); return True if anything changed.

    The new folder is staged whole next to it (everything export does not own, such as
    ``resolutions/`` and ``proof.json``, copied with links kept as links; every file created
    exclusively, so a committed link is never written through) and switched in one atomic
    exchange: a kill leaves the old series or the new one, never a mix of both."""
    from tools.rebase.git.safefs import exchange

    wanted = dict(files)
    wanted["series"] = series_text.encode()
    if _holds_exactly(patches_dir, wanted):
        return False
    parent, prefix = patches_dir.parent, f".{patches_dir.name}-export-"
    for stale in parent.glob(prefix + "*"):  # left by a killed export (callers hold the lock)
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale)
    staged = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        for entry in patches_dir.iterdir():
            if _owned_by_export(entry.name):
                continue
            copy_entry(staged, entry, staged / entry.name)
        for name, data in wanted.items():
            create_new(staged, staged / name, data)
        os.chmod(staged, patches_dir.stat().st_mode & 0o7777)
        if not exchange(staged, patches_dir):  # no atomic exchange here: two renames
            aside = parent / EXPORT_ASIDE.format(name=patches_dir.name)  # a kill between: Layout puts it back
            os.rename(patches_dir, aside)
            os.rename(staged, patches_dir)
            staged = aside
    finally:
        shutil.rmtree(staged, ignore_errors=True)  # after the switch it holds the old folder
    return True


def select(patches: list, wanted, command: str = "prove") -> list:
    """Indices of the patches named in ``wanted`` (Patch-Name, file name or number); all if empty."""
    if not wanted:
        return list(range(len(patches)))
    out = []
    for want in wanted:
        hits = [i for i, p in enumerate(patches)
                if want in (p.name, p.path.name, p.path.name[:4]) or want.lstrip("0") == str(i + 1)]
        if not hits:
            raise RebaseError(f"{command}: no patch in the series is named {want!r}")
        out.extend(h for h in hits if h not in out)
    return sorted(out)
