"""Lock files a killed git left behind (``index.lock``, ``HEAD.lock``, ``refs/...lock``).

git takes ``<file>.lock`` with O_EXCL and removes it when done; a git killed in between leaves it,
and every later git command that needs the file then fails. ``bump --abort``/``--continue`` must
work after a killed bump, so they remove such a lock, but only when no live process could hold
it: none has the lock file open and no git process runs in the work repo (a maintainer's shell
or editor sitting there does not count). (Our own lock, ``lock.py``,
keeps other tool runs out meanwhile.)
"""

import os
from pathlib import Path

from tools.rebase.errors import RebaseError


def lock_files(work: Path) -> list:
    gitdir = work / ".git"
    found = [gitdir / name for name in ("index.lock", "HEAD.lock", "config.lock", "packed-refs.lock",
                                          "MERGE_RR.lock", "ORIG_HEAD.lock")]
    found = [p for p in found if p.exists()]
    refs = gitdir / "refs"
    if refs.is_dir():
        found += sorted(refs.rglob("*.lock"))
    return found


def _live_users(work: Path, locks: list) -> list:
    """``(pid, what)`` of live processes that hold one of ``locks`` open, or git processes running
    inside ``work``."""
    proc = Path("/proc")
    if not proc.is_dir():
        return [(0, "unknown (no /proc to look for live git processes)")]
    wanted = {str(p) for p in locks}
    root = str(work.resolve())
    me = os.getpid()
    users = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            fds = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours to inspect
            continue
        cmd = b" ".join(argv).decode(errors="replace").strip()
        is_git = os.path.basename(argv[0].decode(errors="replace")).startswith("git")
        inside = cwd == root or cwd.startswith(root + os.sep)
        if (is_git and inside) or wanted.intersection(fds):
            users.append((int(entry.name), cmd[:120] or "?"))
    return users


def clear_stale_locks(work: Path) -> list:
    """Remove git lock files in ``work`` left by a killed git; refuse if a live process may hold them."""
    locks = lock_files(work)
    if not locks:
        return []
    users = _live_users(work, locks)
    if users:
        shown = "; ".join(f"pid {pid}: {cmd}" for pid, cmd in users[:5])
        raise RebaseError(f"git lock file(s) {', '.join(str(p) for p in locks)} exist and a live process "
                          f"may hold them ({shown}); wait for it to finish and try again")
    for path in locks:
        path.unlink(missing_ok=True)
    return locks
