"""A line's premise: what it relies on in its upstream base (``lines/NAME/premise.toml``).

A line can rest on upstream code: the dev line drops the fork's mHC because dev's own mHC is the
model there. A new base that loses that code leaves the line's patches merging cleanly into a
tree without the thing they extend. The premise names it, so a bump can check it (``bump/
premise_gate.py``, statically by ``analysis/premise.py``):

    [[symbol]]
    path = "megatron/core/transformer/hyper_connection.py"   # a .py file of the base
    name = "HyperConnectionModule"                            # Name, or Class.member
    why = "dev's own mHC is the model on this line"           # optional, shown when it breaks

The file is committed, so it is untrusted input: every entry is validated and an error names the
entry; nothing in it is run.
"""

import re
import tomllib
from dataclasses import dataclass
from pathlib import PurePosixPath

from tools.rebase.errors import RebaseError
from tools.rebase.git.safefs import read_nofollow

FILE_NAME = "premise.toml"
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
_KEYS = {"path", "name", "why"}


@dataclass(frozen=True)
class Symbol:
    path: str
    name: str
    why: str = ""


def premise_path(layout):
    return layout.home / FILE_NAME


def _check_path(path, where: str) -> str:
    if not isinstance(path, str) or not path.endswith(".py"):
        raise RebaseError(f"{where}: path must be a .py file of the base, got {path!r}")
    parts = PurePosixPath(path).parts
    if path.startswith("/") or "\\" in path or any(p in ("..", ".", "") for p in parts) or parts[0] == ".git":
        raise RebaseError(f"{where}: path {path!r} must be a plain relative path inside the base")
    return path


def parse_premise(text: str, where: str) -> list:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RebaseError(f"{where}: not valid TOML ({exc})") from None
    unknown = sorted(set(data) - {"symbol"})
    if unknown:
        raise RebaseError(f"{where}: unknown table(s) {', '.join(unknown)} (a premise lists [[symbol]] entries)")
    entries = data.get("symbol", [])
    if not isinstance(entries, list):
        raise RebaseError(f"{where}: symbol must be an array of tables ([[symbol]])")
    out = []
    for k, entry in enumerate(entries, 1):
        here = f"{where}: symbol #{k}"
        if not isinstance(entry, dict):
            raise RebaseError(f"{here} is not a table")
        extra = sorted(set(entry) - _KEYS)
        if extra or "path" not in entry or "name" not in entry:
            raise RebaseError(f"{here}: needs path and name (and optionally why); "
                              f"{'unknown ' + ', '.join(extra) if extra else 'missing a key'}")
        name, why = entry["name"], entry.get("why", "")
        if not isinstance(name, str) or not _DOTTED.match(name):
            raise RebaseError(f"{here}: name {name!r} must be Name or Class.member")
        if not isinstance(why, str):
            raise RebaseError(f"{here}: why must be text")
        out.append(Symbol(_check_path(entry["path"], here), name, " ".join(why.split())))
    return out


def read_premise(layout) -> list:
    """The line's premise (empty without the file)."""
    path = premise_path(layout)
    if path.is_symlink():
        raise RebaseError(f"{layout.rel(path)}: must not be a symlink")
    if not path.exists():
        return []
    try:
        text = read_nofollow(path).decode("utf-8")
    except UnicodeDecodeError:
        raise RebaseError(f"{layout.rel(path)}: not UTF-8 text") from None
    return parse_premise(text, layout.rel(path))
