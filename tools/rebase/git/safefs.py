"""Write files in a checkout without following links and without predictable temporary names.

A pull request can commit any path the tool writes (``.rebase/lock``, ``patches/x.patch.tmp``, a
folder on the way) as a symlink to a file outside the checkout. Every write therefore checks each
component below the checkout root with ``lstat`` (a link is an error naming it), opens the final
file with ``O_NOFOLLOW``, and replaces files through a temporary created exclusively
(``mkstemp``: ``O_CREAT|O_EXCL``, a random name) in the target folder.

This module is the tool's only writer of files: ``tests/tools/test_one_writer.py`` walks the
package's source for any other write (``open`` for writing, ``write_text``, ``shutil.copy*``,
``os.open`` with ``O_CREAT`` ...) and fails naming it.
"""

import ctypes
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path

from tools.rebase.errors import RebaseError


def refuse_links_below(root: Path, path: Path) -> None:
    """Error naming the first component of ``path`` below ``root`` that is a symlink."""
    root, path = Path(root), Path(path)
    try:
        rel = path.relative_to(root)
    except ValueError:
        rel = None
    if rel is None:  # outside the checkout (a cache named by the user): check the path itself only
        parts, here = [path], None
    else:
        here, parts = root, []
        for name in rel.parts:
            here = here / name
            parts.append(here)
    for part in parts:
        try:
            mode = os.lstat(part).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISLNK(mode):
            raise RebaseError(f"{part}: is a symlink (to {os.readlink(part)!r}); the tool writes there "
                              f"and never through a link. Remove it (a checkout must not carry it).")


def makedirs(root: Path, path: Path) -> Path:
    """``mkdir -p`` of ``path`` below ``root`` where no component may be a link."""
    refuse_links_below(root, path)
    Path(path).mkdir(parents=True, exist_ok=True)
    refuse_links_below(root, path)  # created by someone else between the check and mkdir
    return Path(path)


def refuse_unwritable(paths, command: str) -> None:
    """Error naming the first of ``paths`` (or, for one not made yet, the folder it would be made
    in) that this user cannot write, before the command changes anything: a read-only checkout
    (mounted read-only by CI, or owned by another user) is refused whole, never left half-done."""
    for path in paths:
        here = Path(path)
        while not os.path.lexists(here) and here != here.parent:
            here = here.parent
        if not os.access(here, os.W_OK | os.X_OK):
            raise RebaseError(
                f"{here}: not writable by this user (uid {os.getuid()}), and `{command}` writes "
                f"{path} there; nothing was changed. Run the tool in a writable copy of the checkout "
                f"(for `pip install .` of a read-only checkout whose megatron/ is already applied, set "
                f"MEGATRON_FORK_SKIP_APPLY=1).")


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that refuses a link as the last component (ELOOP becomes a clear error)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise RebaseError(f"{path}: is a symlink; the tool never opens its files through a link") from None
        raise


def write_file(root: Path, path: Path, data, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` (bytes or str) through an exclusive temporary next to it."""
    path = Path(path)
    makedirs(root, path.parent)
    if isinstance(data, str):
        data = data.encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)  # replaces a link itself, never writes through it
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def create_new(root: Path, path: Path, data, mode: int = 0o644) -> None:
    """Write ``data`` to ``path``, which must not exist yet (``O_CREAT|O_EXCL|O_NOFOLLOW``): for a
    file whose creation itself is the point (a marker, its stamp), never a rename of a temporary."""
    refuse_links_below(root, Path(path).parent)
    if isinstance(data, str):
        data = data.encode()
    fd = open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def exclusive_temp(folder: Path, prefix: str, suffix: str):
    """``(file object, path)`` of a new file with a random name in ``folder`` for streaming into
    (a download); the caller renames it into place or removes it."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=folder)
    return os.fdopen(fd, "wb"), Path(tmp)


def copy_entry(root: Path, src: Path, dst: Path, ignore=None) -> None:
    """Copy ``src`` (a file, a folder or a link, which stays a link) to ``dst``, which must not exist:
    a folder is copied whole with links kept as links, a file through ``write_file``."""
    src, dst = Path(src), Path(dst)
    refuse_links_below(root, dst.parent)
    if os.path.lexists(dst):
        raise RebaseError(f"{dst}: already exists; the tool copies only to a new path")
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_dir():
        shutil.copytree(src, dst, symlinks=True, ignore=ignore)
    else:
        write_file(root, dst, read_nofollow(src), stat.S_IMODE(os.lstat(src).st_mode))


def extract_tar(tar, dest: Path) -> None:
    """Extract the open ``tar`` into ``dest`` (no link on the way; tarfile's ``data`` filter: no
    links, devices or paths outside ``dest`` in the archive)."""
    refuse_links_below(Path(dest).parent, dest)
    tar.extractall(dest, filter="data")


# The most the tool reads from one file: 100x the largest patch file of the series, and far above
# any pin, record, report or source file; a bigger one (a PR can commit one) is an error, not a
# memory spike.
MAX_READ_BYTES = 64 << 20


def holds_bytes(path: Path, data: bytes) -> bool:
    """Whether ``path`` is a plain file holding exactly ``data``, read without following a link:
    a link, a FIFO or a missing file is "no" (the caller rewrites it; nothing is read through it)."""
    try:
        return read_nofollow(path, limit=max(len(data), 1)) == data
    except (OSError, RebaseError):
        return False


def read_nofollow(path: Path, limit: int = MAX_READ_BYTES) -> bytes:
    """The bytes of the regular file ``path``: a link is an error, and so is a FIFO, device or
    folder (opened without blocking, so a FIFO a checkout carries cannot hang the tool), and a file
    over ``limit`` bytes (checked before reading, and again while reading one that grows)."""
    fd = open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise RebaseError(f"{path}: not a regular file; the tool reads only plain files there")
        data = fh.read(limit + 1) if info.st_size <= limit else b""
        if info.st_size > limit or len(data) > limit:
            raise RebaseError(f"{path}: larger than the {limit:,} bytes the tool reads from one file")
        return data


_RENAME_EXCHANGE = 2


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(at_fdcwd, os.fsencode(str(a)), at_fdcwd, os.fsencode(str(b)), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # this file system cannot exchange
        return False
    raise OSError(err, os.strerror(err), str(a))
