"""Resolve pytest node ids named in ``Tests:`` trailers without importing anything."""

import ast
import os
import stat
from pathlib import Path, PurePosixPath

from tools.rebase.errors import RebaseError
from tools.rebase.git.safefs import read_nofollow


def _defines(body, name):
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
    return None


def invalid_test_id(node_id: str):
    """Why ``node_id`` is not a safe pytest argument (a relative path inside tests/), else None.

    Tests: ids reach pytest's command line: ``-p plugin`` or ``--rootdir=/`` would be options,
    and an absolute or ``../`` path would run code from outside the checkout.
    """
    path = node_id.split("::", 1)[0]
    if node_id.startswith("-"):
        return "starts with '-' (it would be read as a pytest option)"
    if any(ord(c) < 32 for c in node_id) or "\\" in path:
        return "contains a control character or a backslash"
    parts = PurePosixPath(path).parts
    if PurePosixPath(path).is_absolute() or ".." in parts or not parts or parts[0] != "tests" \
            or len(parts) < 2:
        return "must be a relative path inside tests/ (no absolute path, no '..')"
    return None


# The largest test file whose definitions ``check`` reads (the biggest of the repository's is
# ~100 KB); a bigger one is named, not parsed.
MAX_TEST_FILE_BYTES = 4 << 20


def _not_plain(root: Path, path: str):
    """Why ``root/path`` is not a plain file or folder of the checkout: a link anywhere on the way
    (a committed one could point at /dev/zero, a FIFO or a file outside), or something else than
    a file or folder at the end; else None. Missing is answered by the caller."""
    here = root
    for part in PurePosixPath(path).parts:
        here = here / part
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"{path} cannot be read ({exc.strerror})"
        if stat.S_ISLNK(mode):
            return (f"{here.relative_to(root).as_posix()} is a symlink; Tests: names plain files of the "
                    f"checkout only (a link could point outside it, or at a device or FIFO that never ends)")
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return f"{path} is not a regular file or folder"
    return None


def missing_test(root: Path, node_id: str):
    """Return why ``node_id`` does not name an existing test, or None if it does."""
    invalid = invalid_test_id(node_id)
    if invalid:
        return invalid
    path, *parts = node_id.split("::")
    file = root / path
    odd = _not_plain(root, path)
    if odd:
        return odd
    if not file.exists():
        return f"{path} does not exist"
    if file.is_dir() or not parts:
        return None
    try:
        tree = ast.parse(read_nofollow(file, MAX_TEST_FILE_BYTES), filename=str(file))
    except RebaseError as exc:
        return str(exc).replace(str(file), path, 1)
    except (SyntaxError, ValueError) as exc:  # ValueError: a null byte
        return f"{path} does not parse: {exc}"
    except RecursionError:
        return f"{path} does not parse: nested too deeply"
    body = tree.body
    for i, part in enumerate(parts):
        name = part.split("[", 1)[0]
        node = _defines(body, name)
        if node is None:
            return f"{path} has no {'::'.join([*parts[:i], name])}"
        body = getattr(node, "body", [])
    return None
