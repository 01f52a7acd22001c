"""Names a merge can break without breaking the syntax: undefined names (pyflakes), names imported
from the base that it no longer defines, and calls of module functions it removed.

Why: a conflict resolution that left a name undefined in ``GPTModel.forward``, or a new base that
renamed a class a patch imports, merges cleanly and compiles; only the tests found it, much later.
pyflakes (a maintained checker; the ``dev`` extras install it) finds undefined names. An import
``from megatron.x import Name`` (or a call ``x.func()`` through ``import megatron.x as x``) is
resolved statically against the revision being checked: the target module's top-level names are
read from its source with ``ast``; nothing of the checkout is imported or run. A module that
defines ``__getattr__`` or star-imports is taken to have any name.
"""

import ast
from dataclasses import dataclass

from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import cat_objects

PACKAGE = "megatron"  # imports of other packages (torch, ...) are not the base's to break


@dataclass(frozen=True)
class NameProblem:
    line: int
    name: str
    what: str  # "undefined", "import-missing", "call-missing"
    detail: str  # the module, for the two import kinds


def _pyflakes():
    try:
        from pyflakes import checker, messages
    except ImportError:
        raise RebaseError("the post-merge lint needs pyflakes (in the dev extras: "
                          "`pip install -e '.[dev]'`, or `pip install pyflakes`)") from None
    return checker, messages


def undefined_names(tree, path: str) -> list:
    """pyflakes' undefined names in a parsed file, as ``NameProblem``s."""
    checker, messages = _pyflakes()
    kinds = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)
    found = checker.Checker(tree, filename=path).messages
    return [NameProblem(m.lineno, str(m.message_args[0]), "undefined", "")
            for m in found if isinstance(m, kinds)]


def _module_of(path: str) -> str:
    """``megatron/core/a.py`` -> ``megatron.core.a`` (an ``__init__.py`` names its package)."""
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _absolute(path: str, level: int, module: str | None) -> str | None:
    """The absolute module of ``from <dots><module> import``, seen from file ``path``."""
    if not level:
        return module
    package = _module_of(path).split(".")
    if not path.endswith("/__init__.py"):
        package = package[:-1]
    if level - 1 > len(package) - 1:
        return None
    base = package[: len(package) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _ours(module: str | None) -> bool:
    return bool(module) and (module == PACKAGE or module.startswith(PACKAGE + "."))


_NAMES_OF_BLOB = {}  # blob id -> top_level_names of its source


class ModuleIndex:
    """What the tree of one revision defines, read from git (never imported): per module its
    top-level names, or None where any name may exist (``__getattr__``, ``import *``)."""

    def __init__(self, repo, rev: str):
        self.repo, self.rev = repo, rev
        self._names = {}  # module -> set, None (anything) or False (no such module)

    def _files(self, module: str) -> list:
        base = module.replace(".", "/")
        return [f"{self.rev}:{base}.py", f"{self.rev}:{base}/__init__.py", f"{self.rev}:{base}"]

    def load(self, modules) -> None:
        """Read the sources of ``modules`` (one git call for all)."""
        todo = sorted({m for m in modules if m not in self._names})
        if not todo:
            return
        found = cat_objects(self.repo, [spec for m in todo for spec in self._files(m)])
        for module in todo:
            source = package = None
            for spec in self._files(module):
                got = found.get(spec)
                if got is None:
                    continue
                kind, data = got[1], got[2]
                if kind == "blob" and spec.endswith(".py") and source is None:
                    source, oid = data.decode("utf-8", "replace"), got[0]
                elif kind == "tree":
                    package = True
            if source is not None:
                if oid not in _NAMES_OF_BLOB:  # most modules are the same blob at every revision
                    _NAMES_OF_BLOB[oid] = top_level_names(source)
                self._names[module] = _NAMES_OF_BLOB[oid]
            elif package:  # a namespace package: its submodules are its names
                self._names[module] = None
            else:
                self._names[module] = False

    def exists(self, module: str) -> bool:
        self.load([module])
        return self._names[module] is not False

    def has(self, module: str, name: str) -> bool:
        """``module`` defines ``name`` (or has a submodule of that name)."""
        self.load([module, f"{module}.{name}"])
        names = self._names[module]
        if names is None or (names and name in names):
            return True
        return self._names[f"{module}.{name}"] is not False


def top_level_names(source: str):
    """The names a module defines at its top level (also under ``if``/``try``/``with``); None
    when it can have any (it defines ``__getattr__`` or star-imports), or does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    names = set()

    def targets(node):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                targets(elt)
        elif isinstance(node, ast.Starred):
            targets(node.value)

    def body(stmts):
        for stmt in stmts:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(stmt.name)
            elif isinstance(stmt, ast.Assign):
                for t in stmt.targets:
                    targets(t)
            elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
                targets(stmt.target)
            elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                for alias in stmt.names:
                    if alias.name == "*":
                        return False
                    names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(stmt, (ast.For, ast.AsyncFor)):
                targets(stmt.target)
            if isinstance(stmt, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
                if body(stmt.body) is False or body(getattr(stmt, "orelse", [])) is False:
                    return False
            elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
                for part in (stmt.body, stmt.orelse, stmt.finalbody, *[h.body for h in stmt.handlers]):
                    if body(part) is False:
                        return False
        return True

    if body(tree.body) is False or "__getattr__" in names:
        return None
    return names


_GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _catches_import_errors(node) -> bool:
    for handler in node.handlers:
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(k is None or getattr(k, "id", getattr(k, "attr", "")) in _GUARDS for k in kinds):
            return True
    return False


def _collect(tree, path: str):
    """One pass over the file: ``from megatron... import`` entries ``(line, module, name, bound)``,
    ``{alias: module}`` of ``import megatron.x as alias``, and calls ``(line, alias, attr)`` of
    ``alias.attr(...)``. Imports inside a ``try`` that catches a failed import are allowed to
    fail (an optional name, or one of another base) and left out."""
    froms, aliases, calls = [], {}, []
    stack = [(tree, False)]
    while stack:
        node, guarded = stack.pop()
        if isinstance(node, ast.ImportFrom) and not guarded:
            module = _absolute(path, node.level, node.module)
            if _ours(module):
                froms += [(node.lineno, module, a.name, a.asname or a.name) for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Import) and not guarded:
            aliases.update({a.asname: a.name for a in node.names if _ours(a.name) and a.asname})
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and isinstance(node.func.value, ast.Name)):
            calls.append((node.lineno, node.func.value.id, node.func.attr))
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            inner = guarded or _catches_import_errors(node)
            stack += [(stmt, inner) for stmt in node.body]
            stack += [(child, guarded) for part in (node.handlers, node.orelse, node.finalbody) for child in part]
            continue
        stack += [(child, guarded) for child in ast.iter_child_nodes(node)]
    return froms, aliases, calls


def broken_imports(tree, path: str, index: ModuleIndex) -> list:
    """Imports of names the base (``index``'s revision) does not define, and calls
    ``alias.func(...)`` of a module function it does not define."""
    froms, aliases, calls = _collect(tree, path)
    index.load({m for _, m, _, _ in froms} | {f"{m}.{n}" for _, m, n, _ in froms} | set(aliases.values()))
    out = []
    for line, module, name, bound in froms:
        if not index.exists(module):
            out.append(NameProblem(line, name, "import-missing", module))
        elif index.has(module, name):
            if index.exists(f"{module}.{name}"):
                aliases.setdefault(bound, f"{module}.{name}")  # a submodule: its calls are checked too
        else:
            out.append(NameProblem(line, name, "import-missing", module))
    calls = [(line, aliases[alias], attr) for line, alias, attr in calls if alias in aliases]
    index.load(set(aliases.values()) | {f"{module}.{attr}" for _, module, attr in calls})
    for line, module, attr in calls:
        if index.exists(module) and not index.has(module, attr):
            out.append(NameProblem(line, attr, "call-missing", module))
    return out
