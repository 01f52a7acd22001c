"""The shape of a recorded resolution (``resolutions/<Patch-Name>/<id>/``) as ``check`` and the
bump both read it.

Two kinds share the shape: a rerere recording (``<id>`` the conflict's rerere hash, its
``preimage`` holding the conflict markers) and an edit of a file git merged cleanly (``<id>`` the
git blob id of the merged file, which is its ``preimage``; ``path`` names the one file of the
checkout it edits). A recording written before edits named their file has no ``path``: a bump
applies it only to a file its patch's replay changes."""

import hashlib
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.git.safefs import read_nofollow

PATH_FILE = "path"


def blob_id(data: bytes) -> str:
    """The git blob id of ``data`` (what ``git hash-object`` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def recorded_path(entry: Path):
    """The file the merge edit ``entry`` names (its ``path`` file); None when it names none."""
    named = entry / PATH_FILE
    if not (named.exists() or named.is_symlink()):
        return None
    try:
        text = read_nofollow(named).decode("utf-8")
    except UnicodeDecodeError:
        raise RebaseError(f"{named}: not UTF-8 (a recorded edit's path file holds one path)") from None
    path = text[:-1] if text.endswith("\n") else text
    if not path or any(c in path for c in "\n\r\0") or path.startswith("/"):
        raise RebaseError(f"{named}: must hold one relative path on one line, not {text[:80]!r}")
    return path


def is_merge_edit(entry: Path, preimage: bytes) -> bool:
    """A merge edit is keyed by its preimage's blob id (a rerere id hashes the conflict instead)."""
    return blob_id(preimage) == entry.name
