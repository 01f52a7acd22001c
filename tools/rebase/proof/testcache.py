"""Results of ``Tests:`` runs on a whole stack, kept so an unchanged stack is not tested twice.

Why: the finishing gate of a bump and ``prove`` both run every patch's ``Tests:`` on the whole
stack (minutes on the release line). A result is reused when nothing it depends on changed: the
key is the stack's tree (every file of base + patches, so any change of any patch or of the base
re-tests everything: on the whole stack, any patch can break any test), the checkout's test files
(``tests/``, ``pytest.ini``), the pin the tests read, the interpreter and the node id. So a
``bump --continue`` after a stop that changed nothing, ``prove`` after a finished bump, or a second
``prove``, reuse them all. Only real outcomes (passed, failed, skipped) are kept: an environment
that could not run a test is asked again. The file lives in the download cache
(``FORK_REBASE_CACHE``, shared by the checkouts of one machine, as the keys allow), bounded to
the newest entries; nothing of the checkout is written.
"""

import hashlib
import json
import sys
from pathlib import Path

from tools.rebase.git.safefs import read_nofollow, write_file

FILE_NAME = "test-results.json"
KEEP = 20000  # entries; the oldest go first
_INPUTS = ("tests", "pytest.ini")


def _files_digest(root: Path) -> str:
    """sha256 over the checkout's test files (paths and bytes; links by their target)."""
    h = hashlib.sha256()
    for name in _INPUTS:
        top = Path(root) / name
        paths = [top] if top.is_file() or top.is_symlink() else sorted(top.rglob("*")) if top.is_dir() else []
        for path in paths:
            if "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                h.update(f"L {rel}\0{path.readlink()}\0".encode())
            elif path.is_file():
                h.update(f"F {rel}\0".encode() + path.read_bytes() + b"\0")
    return h.hexdigest()


class TestResults:
    """``get``/``put`` of ``{node id: (outcome, message)}`` for one stack tree and checkout."""

    def __init__(self, layout, tree: str, pin_text: str):
        self.path = layout.cache / FILE_NAME
        self._root = layout.root
        prefix = "\0".join([tree, _files_digest(layout.root), hashlib.sha256(pin_text.encode()).hexdigest(),
                            sys.executable, sys.version])
        self._prefix = hashlib.sha256(prefix.encode()).hexdigest()
        self._entries = self._read()

    def _key(self, node: str) -> str:
        return hashlib.sha256(f"{self._prefix}\0{node}".encode()).hexdigest()

    def _read(self) -> dict:
        try:
            data = json.loads(read_nofollow(self.path)) if self.path.is_file() else {}
        except (OSError, ValueError, UnicodeDecodeError):
            return {}  # a damaged cache is no cache
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items()
                if isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v)}

    def get(self, nodes) -> dict:
        return {n: tuple(self._entries[self._key(n)]) for n in nodes if self._key(n) in self._entries}

    def forget(self, nodes) -> None:
        """Drop the results of ``nodes`` for this stack (a benchmark's cold run)."""
        keys = {self._key(n) for n in nodes}
        self._entries = {k: v for k, v in self._entries.items() if k not in keys}
        self._write()

    def put(self, results: dict) -> None:
        kept = {self._key(n): [o, m] for n, (o, m) in results.items()
                if o in ("passed", "skipped") or o.startswith("failed")}
        if not kept:
            return
        for key in kept:
            self._entries.pop(key, None)  # re-inserted last: the newest
        self._entries.update(kept)
        self._entries = dict(list(self._entries.items())[-KEEP:])
        self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_file(self.path.parent, self.path, json.dumps(self._entries, sort_keys=False) + "\n")
