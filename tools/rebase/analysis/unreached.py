"""Patches that merged cleanly into code the new base no longer reaches.

A clean merge says nothing about whether the code a patch changes still runs: upstream can stop
importing a module, remove a function's last caller, or replace a class with another. Such a
patch re-applies "renumbered" and silently does nothing. Here each hunk of a patch is placed in
its *unit*, the innermost function (or method) around its new lines, else the class, else the
module, and the unit is asked, statically, whether anything in the tree still reaches it:

- a module is reached when some import line of the tree names its last component (``import x``,
  ``from .x import``, ``from pkg import x``, ``pkg.x``); a package's ``__init__.py`` always is;
- a function, method or class is reached when its module is and its name occurs in the tree's
  Python files more often than it is defined (a call, a reference, a registration).

A patch is flagged when every hunk of its new version lands in an unreached unit of the new stack
while its old version had a hunk in a reached unit of the old stack (so "no longer"). Limits, kept
on purpose: names are matched as words, not resolved (a caller of another function of the same
name counts, so this misses some dead code and does not invent any); dunder methods, ``forward``
and short names count as reached (called implicitly); imports by string (``importlib``) and a
class that a config now refuses to build are not seen. Tests (``tests/``) do not reach anything.
"""

import ast
import re
from collections import Counter

from tools.rebase.git.gitcmd import git, git_proc

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")
_IMPORT_LINE = r"^\s*(from|import)\s"
ALWAYS_REACHED = {"forward", "main", "setup", "backward"}
SCOPE = ("megatron",)  # the part of the tree whose references count
FLAGGED_FROM = ("identical", "renumbered", "refreshed", "message-only", "reordered")


def _hunk_lines(repo, commit: str) -> dict:
    """``{path: [(first, last) new-side lines]}`` of ``commit``'s .py changes (a pure deletion
    gives the line it follows)."""
    out = git("diff", "-U0", "--no-color", "--no-renames", f"{commit}^", commit, "--", "*.py", cwd=repo)
    found, path = {}, None
    for line in out.splitlines():
        if line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else None
        m = _HUNK.match(line)
        if m and path:
            start, count = int(m[1]), int(m[2] if m[2] is not None else 1)
            found.setdefault(path, []).append((max(start, 1), max(start + count - 1, start, 1)))
    return found


def _units(text: str, spans: list, path: str) -> list:
    """The unit of each span: ``("def", name)``, ``("class", name)`` or ``("module", path)``."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return [("module", path)] * len(spans)
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    out = []
    for first, last in spans:
        around = [n for n in nodes if n.lineno <= first and last <= (n.end_lineno or n.lineno)]
        if not around:
            out.append(("module", path))
            continue
        inner = max(around, key=lambda n: n.lineno)
        out.append(("class" if isinstance(inner, ast.ClassDef) else "def", inner.name, path))
    return out


def _module_leaf(path: str) -> str:
    leaf = path.rsplit("/", 1)[-1][:-3]
    return "" if leaf == "__init__" else leaf


class Reach:
    """The references of one tree (``tip``) that decide reachability, read with two ``git grep``s."""

    def __init__(self, repo, tip: str, names):
        self.repo, self.tip = repo, tip
        proc = git_proc("grep", "-h", "-E", _IMPORT_LINE, tip, "--", *[f"{s}/*.py" for s in SCOPE], cwd=repo)
        self.imported = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", proc.stdout))
        self.counts = Counter()
        names = sorted({n for n in names if n})
        if names:
            args = ["grep", "-h", "-o", "-w", "-F"]
            for n in names:
                args += ["-e", n]
            proc = git_proc(*args, tip, "--", *[f"{s}/*.py" for s in SCOPE], cwd=repo)
            self.counts.update(proc.stdout.split())

    def module(self, path: str) -> bool:
        leaf = _module_leaf(path)
        return not leaf or leaf in self.imported

    def name(self, name: str, path: str) -> bool:
        if name in ALWAYS_REACHED or (name.startswith("__") and name.endswith("__")) or len(name) <= 3:
            return self.module(path)
        return self.module(path) and self.counts[name] >= 2  # its definition is one occurrence

    def unit(self, unit) -> bool:
        return self.module(unit[1]) if unit[0] == "module" else self.name(unit[1], unit[2])


def units_of(repo, commit: str) -> list:
    """Every hunk's unit of ``commit`` (only files under ``SCOPE``)."""
    units = []
    for path, spans in sorted(_hunk_lines(repo, commit).items()):
        if not path.startswith(tuple(f"{s}/" for s in SCOPE)):
            continue
        proc = git_proc("cat-file", "blob", f"{commit}:{path}", cwd=repo)
        if proc.returncode != 0:
            continue  # deleted by the patch
        units += _units(proc.stdout, spans, path)
    return units


def _describe(unit, reach) -> str:
    path = unit[1] if unit[0] == "module" else unit[2]
    if unit[0] == "module" or not reach.module(path):
        return f"module {path} (no import of it left)"
    return f"{'function' if unit[0] == 'def' else 'class'} {unit[1]} in {unit[2]} (no reference left)"


def flag_unreached(repo, mapping: list, old_tip: str, new_tip: str) -> None:
    """Mark the mapping entries (one old, one new commit, quiet statuses) whose new version lands
    only in unreached code and whose old version did not: status ``unreached``, the old status in
    ``was``, the units in the note."""
    candidates = [e for e in mapping if e["status"] in FLAGGED_FROM and len(e["old"]) == len(e["new"]) == 1]
    if not candidates:
        return
    new_units = {e["new"][0]["commit"]: units_of(repo, e["new"][0]["commit"]) for e in candidates}
    names = {u[1] for units in new_units.values() for u in units if u[0] != "module"}
    reach_new = Reach(repo, new_tip, names)
    dead = {c: units for c, units in new_units.items() if units and not any(reach_new.unit(u) for u in units)}
    if not dead:
        return
    flagged = [e for e in candidates if e["new"][0]["commit"] in dead]
    old_units = {e["old"][0]["commit"]: units_of(repo, e["old"][0]["commit"]) for e in flagged}
    reach_old = Reach(repo, old_tip, {u[1] for units in old_units.values() for u in units if u[0] != "module"})
    for e in flagged:
        if not any(reach_old.unit(u) for u in old_units[e["old"][0]["commit"]]):
            continue  # already unreached before the bump: not this bump's finding
        units = dead[e["new"][0]["commit"]]
        shown = "; ".join(dict.fromkeys(_describe(u, reach_new) for u in units))
        note = f"merged cleanly, but every hunk lands in code the new base no longer reaches: {shown}"
        e["was"], e["status"] = e["status"], "unreached"
        e["note"] = f"{note}; {e['note']}" if e["note"] else note
