"""Markers that tell a repository the tool made (a work repo, a cache repo) from one it did not.

A checkout is data: a pull request, or a tarball of one, can carry ``.rebase/work/.git`` or a cache
repo whose ``config`` sets ``core.worktree`` or ``include.path``, and git reads a repository's own
config whatever the tool pins. A marker file with fixed text could be copied along with it, so the
marker records what no archive can reproduce: the inode and change time (``st_ctime_ns``, set by
the kernel when a file is created, never by ``tar`` or ``cp``) of a stamp file next to it. An
unpacked or copied repository therefore fails the check, as does one another user owns.
"""

import os
import stat
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.git.safefs import create_new

STAMP_SUFFIX = ".stamp"
WORK_MARKER = "megatron-rebase-work"  # in the .git of every work repo the tool creates
WORK_PURPOSE = "a work repo"
BACKUP_MARKER = "megatron-rebase-backup"  # in every bump backup folder (bump/journal.py)
BACKUP_PURPOSE = "a bump's backup"


def _text(purpose: str, st) -> str:
    return f"created by tools.rebase as {purpose}\nstamp: inode {st.st_ino} changed {st.st_ctime_ns}\n"


def mark(git_dir: Path, name: str, purpose: str) -> None:
    """Write ``git_dir/name`` (and its stamp) for a repository the tool has just created."""
    git_dir = Path(git_dir)
    stamp = git_dir / (name + STAMP_SUFFIX)
    create_new(git_dir, stamp, b"")
    create_new(git_dir, git_dir / name, _text(purpose, os.lstat(stamp)))


def is_marked(git_dir: Path, name: str, purpose: str) -> bool:
    """Whether ``git_dir`` is a real folder of this user holding the marker ``mark`` wrote there."""
    git_dir = Path(git_dir)
    try:
        st_dir = os.lstat(git_dir)
        st_marker = os.lstat(git_dir / name)
        st_stamp = os.lstat(git_dir / (name + STAMP_SUFFIX))
    except OSError:  # absent, not a folder, or another user's folder this one cannot enter
        return False
    uid = os.getuid()
    if not (stat.S_ISDIR(st_dir.st_mode) and stat.S_ISREG(st_marker.st_mode) and stat.S_ISREG(st_stamp.st_mode)):
        return False
    if not st_dir.st_uid == st_marker.st_uid == st_stamp.st_uid == uid:
        return False
    try:
        fd = os.open(git_dir / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # swapped for a link since the lstat, or unreadable
        return False
    with os.fdopen(fd, "rb") as fh:
        text = fh.read(4096)
    return text == _text(purpose, st_stamp).encode()


def refuse_unmarked(git_dir: Path, name: str, purpose: str, advice: str) -> None:
    """Error naming ``git_dir`` (a repository, or a folder such as a bump's backup) when it
    exists and the tool did not make it (see ``is_marked``)."""
    if os.path.lexists(git_dir) and not is_marked(git_dir, name, purpose):
        raise RebaseError(
            f"{git_dir}: not {purpose} made here by tools.rebase for uid {os.getuid()} (no valid "
            f"{name} marker: committed, unpacked from an archive, copied, made by an older version of "
            f"the tool, or another user's); nothing is read from it and no git command runs in it. {advice}")


# ---------------------------------------------------------------- a file the tool wrote (a cached sdist)
#
# A cache entry is one file, not a folder that can hold a stamp: its marker, next to it, records
# the entry's own inode, change time and size, which an unpacked or copied file does not keep.

SDIST_PURPOSE = "a cached sdist"
FILE_MARKER_SUFFIX = ".owned"


def _file_text(purpose: str, st) -> str:
    return f"created by tools.rebase as {purpose}\nfile: inode {st.st_ino} changed {st.st_ctime_ns} size {st.st_size}\n"


def file_marker(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + FILE_MARKER_SUFFIX)


def mark_file(path: Path, purpose: str) -> None:
    """Write the marker of the file ``path`` the tool has just put in place (one left over is replaced)."""
    marker = file_marker(path)
    if os.path.lexists(marker):
        os.unlink(marker)
    create_new(Path(path).parent, marker, _file_text(purpose, os.lstat(path)))


def is_marked_file(path: Path, purpose: str) -> bool:
    """Whether ``path`` is a regular file of this user that ``mark_file`` marked where it is now."""
    try:
        st = os.lstat(path)
        st_marker = os.lstat(file_marker(path))
    except OSError:
        return False
    if not (stat.S_ISREG(st.st_mode) and stat.S_ISREG(st_marker.st_mode)) or not st.st_uid == st_marker.st_uid == os.getuid():
        return False
    try:
        fd = os.open(file_marker(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as fh:
        text = fh.read(4096)
    return text == _file_text(purpose, st).encode()
