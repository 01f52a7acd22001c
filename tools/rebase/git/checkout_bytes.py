"""The tool's inputs in a git checkout are read as their committed bytes, or refused.

A reviewer reads a pull request's blobs; the tool reads the working tree. A committed
``.gitattributes`` (at any level) can make git write other bytes on checkout: a
``working-tree-encoding`` turns a line of kanji into ASCII code, ``eol``/``text``/``crlf``
rewrite line ends, ``ident`` expands ``$Id$``, and a ``filter`` runs whatever driver the machine
configures. So before a command reads anything, each tracked input file (``INPUTS``) is hashed
twice by git, as the file is and as git would store it: different ids mean the working-tree
bytes are not the blob's, and the tool refuses, naming the file. A ``filter`` attribute is
refused outright, since hermetic git cannot run the machine's driver to compare.
"""

import os
import stat
from pathlib import Path

from tools.rebase.errors import RebaseError

# Everything the tool reads from a checkout as data (the pins, series, patches, records,
# resolutions and reports of every line, and the README's patch table).
INPUTS = ("upstream.toml", "patches", "lines", "REBASE_REPORT.md", "REBASE_REPORT.json", "README.md")
# Attributes that change the bytes git writes on checkout; reported with a refusal.
CONVERTING = ("working-tree-encoding", "filter", "ident", "text", "eol", "crlf")


def _git_env(root: Path) -> dict:
    return {"GIT_DIR": str(root / ".git"), "GIT_WORK_TREE": str(root)}


def _regular_tracked(root: Path, proc_stdout: str) -> list:
    """Tracked inputs that are regular files in the working tree (links, FIFOs and missing files
    are refused or skipped by the readers themselves; hashing a FIFO would block)."""
    found = []
    for rel in filter(None, proc_stdout.split("\0")):
        try:
            mode = os.lstat(root / rel).st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode):
            found.append(rel)
    return found


def _attributes(root: Path, paths: list) -> dict:
    """``{path: {attribute: value}}`` of the converting attributes set on each path."""
    from tools.rebase.git.gitcmd import git

    out = git("check-attr", "-z", "--stdin", *CONVERTING, cwd=root, env=_git_env(root),
              input="\0".join(paths) + "\0")
    fields = out.split("\0")
    found = {}
    for i in range(0, len(fields) - 2, 3):
        path, name, value = fields[i:i + 3]
        if value not in ("unspecified", "unset"):
            found.setdefault(path, {})[name] = value
    return found


def _ids(root: Path, paths: list, *flags) -> list:
    from tools.rebase.git.gitcmd import git

    out = git("hash-object", *flags, "--stdin-paths", cwd=root, env=_git_env(root),
              input="".join(f"{p}\n" for p in paths))
    return out.split()


def converted_inputs(root: Path) -> list:
    """``(path, why)`` of each tracked input whose working-tree bytes git converts."""
    from tools.rebase.git.gitcmd import git_proc

    root = Path(root)
    if not (root / ".git").exists():
        return []  # no repository (an unpacked archive): no attributes apply to its files
    proc = git_proc("ls-files", "-z", "--", *INPUTS, cwd=root, env=_git_env(root))
    if proc.returncode != 0:
        return []  # Layout.refuse_tracked has judged git's answer already
    paths = _regular_tracked(root, proc.stdout)
    odd = [p for p in paths if "\n" in p or "\r" in p]
    if odd:
        return [(p, "its name holds a line break") for p in odd]
    if not paths:
        return []
    attributes = _attributes(root, paths)
    bad = [(p, attributes[p]) for p in paths if "filter" in attributes.get(p, {})]
    stored, raw = _ids(root, paths), _ids(root, paths, "--no-filters")
    bad += [(p, attributes.get(p, {})) for p, a, b in zip(paths, stored, raw) if a != b and p not in dict(bad)]
    return [(p, _why(attrs)) for p, attrs in bad]


def _why(attrs: dict) -> str:
    said = ", ".join(f"{k}={v}" if v != "set" else k for k, v in sorted(attrs.items()))
    return f"git converts it on checkout ({said or 'an attribute or config'})"


def refuse_converted_inputs(root: Path) -> None:
    """Error naming every tool input whose working-tree bytes are not its committed blob."""
    bad = converted_inputs(root)
    if not bad:
        return
    shown = "; ".join(f"{p}: {why}" for p, why in bad[:8]) + (f"; and {len(bad) - 8} more" if len(bad) > 8 else "")
    raise RebaseError(
        f"{root}: the working-tree bytes of {len(bad)} tool input(s) are not their committed blobs: {shown}. "
        f"A reviewer reads the blob, the tool would read the converted file; a .gitattributes "
        f"(any level) must set no working-tree-encoding, eol, text, crlf, ident or filter on "
        f"{', '.join(INPUTS)}. Remove that attribute and check the files out again; nothing was read or written")
