"""What names an upstream tree defines, read statically: the ast of its files at a commit, never
an import (a base is untrusted code, and importing it needs torch and more).

A file *defines* a name when it binds it at module level (``class``, ``def``, an assignment, an
import) or in a class body (a method, a field, a class attribute), or assigns ``self.NAME`` in a
method; ``Class.member`` asks for the member in that class. Limits: names made dynamically
(``setattr``, ``globals()``, ``exec``) are not seen, and a name defined twice counts once.
"""

import ast
import re

from tools.rebase.git.gitcmd import git_proc

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _targets(node) -> list:
    if isinstance(node, (ast.Assign,)):
        return node.targets
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return [node.target]
    return []


def _names_bound(body) -> set:
    """Names a module or class body binds directly."""
    found = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= {(a.asname or a.name).split(".")[0] for a in node.names}
        for target in _targets(node):
            for sub in ast.walk(target):
                if isinstance(sub, ast.Name):
                    found.add(sub.id)
        if isinstance(node, (ast.If, ast.Try)):  # guarded definitions (``try: import x``)
            for part in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", []),
                         *[h.body for h in getattr(node, "handlers", [])]):
                found |= _names_bound(part)
    return found


def _self_attributes(cls: ast.ClassDef) -> set:
    found = set()
    for node in ast.walk(cls):
        for target in _targets(node):
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                    found.add(sub.attr)
    return found


def definitions(text: str) -> dict:
    """``{"": names the module binds, "Class": its members}`` of one file's text ({} if it does not parse)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return {}
    out = {"": _names_bound(tree.body)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            out.setdefault(node.name, set()).update(_names_bound(node.body) | _self_attributes(node))
    return out


def defines(defs: dict, dotted: str) -> bool:
    """Whether ``definitions`` output ``defs`` has ``Name`` (anywhere: module or a class) or ``Class.member``."""
    owner, _, member = dotted.rpartition(".")
    if owner:
        return member in defs.get(owner.split(".")[-1], set())
    return any(dotted in names for names in defs.values())


def file_text(work, rev: str, path: str):
    """The text of ``path`` at ``rev`` (None when it has no such file)."""
    proc = git_proc("cat-file", "blob", f"{rev}:{path}", cwd=work)
    return proc.stdout if proc.returncode == 0 else None


def defined_in_tree(work, rev: str, names) -> set:
    """Which of ``names`` (plain identifiers) some ``*.py`` file of ``rev`` defines: one ``git
    grep`` finds the files that mention them, only those are parsed."""
    names = sorted({n for n in names if _IDENT.match(n)})
    if not names:
        return set()
    args = ["grep", "-w", "-F", "-l"]
    for n in names:
        args += ["-e", n]
    proc = git_proc(*args, rev, "--", "*.py", cwd=work)
    found = set()
    for spec in proc.stdout.splitlines():
        path = spec.split(":", 1)[1] if spec.startswith(f"{rev}:") else spec
        text = file_text(work, rev, path)
        if text is None:
            continue
        defs = definitions(text)
        found |= {n for n in names if n not in found and defines(defs, n)}
        if len(found) == len(names):
            break
    return found


def is_ancestor(work, commit: str, rev: str) -> bool:
    return git_proc("merge-base", "--is-ancestor", commit, rev, cwd=work).returncode == 0


def resolve_commit(work, token: str) -> str:
    """The full id of the commit ``token`` abbreviates in ``work`` ("" when none or ambiguous)."""
    proc = git_proc("rev-parse", "--verify", "-q", f"{token}^{{commit}}", cwd=work)
    return proc.stdout.strip() if proc.returncode == 0 else ""
