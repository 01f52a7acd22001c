"""One lock per checkout for every command that writes tool state.

Two ``apply`` runs at once (two ``pip install .``, tox) would otherwise share the work repo's index,
the staging folders and ``state.json``. The lock is an ``flock`` on ``.rebase/lock``: the kernel
drops it when its holder dies, so a lock left by a killed run is never stale (the file itself
stays; it only says who held it last). The holder writes ``pid command`` into the file so a
refused run can say who holds it. Re-entrant within one process (``bump`` runs ``apply``).
"""

import contextlib
import fcntl
import os
import time
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.git.safefs import makedirs, open_nofollow, read_nofollow, refuse_unwritable

WAIT_ENV = "FORK_REBASE_LOCK_WAIT"
_held = {}  # lock path -> [fd, depth]


@contextlib.contextmanager
def key_locked(folder: Path, key: str):
    """Hold ``folder/<key>.lock`` (blocking) while one process fills one entry of a shared cache:
    two cold runs on one cache (two CI jobs) then fetch once, the second finding the entry whole.
    An ``flock``: a holder that is killed releases it, so nothing is left to jam the next run."""
    fd = open_nofollow(Path(folder) / f"{key}.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# They write the tool's state only (the lock, the work repo), not the checkout's files; ``prove
# --record`` writes patches/proof.json and the README, so it is not one of them.
READ_ONLY_COMMANDS = ("check", "prove", "prove --mutants")


def written_by(layout, command: str) -> list:
    """The folders of the checkout ``command`` writes in: the state (lock, work repo) always; the
    package, the line's files and ``patches/`` unless it only reads them."""
    paths = [layout.state_dir]
    if command not in READ_ONLY_COMMANDS:
        paths += [layout.root, layout.package, layout.home, layout.patches]
    return paths


def lock_path(layout) -> Path:
    return layout.lock_file


def _holder(path: Path) -> str:
    try:
        text = read_nofollow(path).decode("utf-8", "replace").strip()
    except (OSError, RebaseError):
        return "an unknown process"
    pid, _, command = text.partition(" ")
    if not pid.isdigit():
        return "an unknown process"
    return f"pid {pid} ({command or 'unknown command'})"


def _wait_seconds(default: float) -> float:
    value = os.environ.get(WAIT_ENV)
    if value is None:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        raise RebaseError(f"{WAIT_ENV}={value!r} is not a number of seconds") from None


@contextlib.contextmanager
def locked(layout, command: str, wait: float = 0.0):
    """Hold the checkout's lock for ``command``; wait up to ``wait`` seconds (``FORK_REBASE_LOCK_WAIT``
    overrides) for another holder, then refuse naming it."""
    path = lock_path(layout)
    key = str(path)
    if key in _held:
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return
    layout.refuse_links()  # before .rebase/ is created or entered
    refuse_unwritable(written_by(layout, command), command)
    makedirs(layout.root, path.parent)
    fd = open_nofollow(path, os.O_RDWR | os.O_CREAT)  # a committed link would be truncated through
    deadline = time.monotonic() + _wait_seconds(wait)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RebaseError(
                        f"another tools.rebase command is running in {layout.root}: the lock "
                        f"{path} is held by {_holder(path)}; wait for it to finish "
                        f"(set {WAIT_ENV}=SECONDS to wait)") from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {command}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    _held[key] = [fd, 1]
    try:
        yield
    finally:
        _held.pop(key)
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
