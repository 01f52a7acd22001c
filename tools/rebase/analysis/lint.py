"""Post-merge lint: catch a clean 3-way merge that silently broke a Python file.

A textual merge can succeed and still leave, say, two definitions of the same dataclass field
(upstream added it, our patch added it too, at different spots), a name the resolution no longer
defines, or an import of a name the new base renamed. After each replayed patch the Python files
it touches are parsed and checked for: does not compile; a name defined twice in one class body
or at module level; a function defined twice; an undefined name (pyflakes); a name imported from
``megatron`` that the revision's tree does not define, and a call ``module.func()`` of a function
it does not define (``namecheck.py``, resolved statically from git, nothing imported). Only
findings that are new are reported: one already present in the baselines' version of the file
(the new upstream file, the patch's own old version), checked against the baseline's own tree, is
upstream's (or our) state, not merge damage.
"""

import ast
import hashlib
from dataclasses import dataclass

from tools.rebase.analysis.namecheck import ModuleIndex, broken_imports, undefined_names
from tools.rebase.git.gitcmd import cat_objects, git

# Decorators that legitimately redefine a name (property accessors, overloads, dispatch).
_REDEFINING_DECORATORS = ("setter", "getter", "deleter", "overload", "register")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    scope: str  # "module" or "class Name"
    name: str
    what: str  # "syntax", "duplicate", "undefined", "import-missing", "call-missing"

    @property
    def key(self) -> tuple:
        return (self.path, self.scope, self.name, self.what)

    def __str__(self) -> str:
        if self.what == "syntax":
            return f"{self.path}:{self.line}: does not compile: {self.name}"
        if self.what == "undefined":
            return f"{self.path}:{self.line}: undefined name {self.name!r}"
        if self.what == "import-missing":
            return f"{self.path}:{self.line}: imports {self.name!r} from {self.scope}, which does not define it"
        if self.what == "call-missing":
            return f"{self.path}:{self.line}: calls {self.scope}.{self.name}(), which does not exist"
        return f"{self.path}:{self.line}: {self.name!r} is defined twice in {self.scope}"

    def to_json(self) -> dict:
        return {"path": self.path, "line": self.line, "scope": self.scope, "name": self.name,
                "what": self.what, "message": str(self)}


def _decorator_name(node) -> str:
    while isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _defined(stmt, in_class: bool):
    """(name, line) pairs a body statement defines that must be unique in that body."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if any(_decorator_name(d) in _REDEFINING_DECORATORS for d in stmt.decorator_list):
            return []
        return [(stmt.name, stmt.lineno)]
    if isinstance(stmt, ast.ClassDef):
        return [(stmt.name, stmt.lineno)]
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return [(stmt.target.id, stmt.lineno)]
    if in_class and isinstance(stmt, ast.Assign):
        return [(t.id, stmt.lineno) for t in stmt.targets if isinstance(t, ast.Name)]
    return []


def _body_findings(path, body, scope, in_class, out):
    seen = {}
    for stmt in body:
        for name, line in _defined(stmt, in_class):
            if name in seen:
                out.append(Finding(path, line, scope, name, "duplicate"))
            else:
                seen[name] = line
        if isinstance(stmt, ast.ClassDef):
            _body_findings(path, stmt.body, f"class {stmt.name}", True, out)


def lint_source(path: str, text: str, index=None, imports_only=False) -> list:
    """All findings in one file's text (not yet filtered against a baseline); ``index`` (a
    ``namecheck.ModuleIndex`` of the revision the file belongs to) adds the import checks, which
    are all there is with ``imports_only`` (the others depend on the text alone)."""
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        return [] if imports_only else [Finding(path, exc.lineno or 0, "module", exc.msg, "syntax")]
    except ValueError as exc:  # e.g. NUL bytes
        return [] if imports_only else [Finding(path, 0, "module", str(exc), "syntax")]
    imports = [] if index is None else [Finding(path, p.line, p.detail, p.name, p.what)
                                        for p in broken_imports(tree, path, index)]
    if imports_only:
        return _first_of_each(imports)
    key = (path, hashlib.sha1(text.encode("utf-8", "replace")).hexdigest())
    if key not in _TEXT_FINDINGS:  # the same blob comes back for every patch that touches it
        out = []
        _body_findings(path, tree.body, "module", False, out)
        out += [Finding(path, p.line, "module", p.name, p.what) for p in undefined_names(tree, path)]
        _TEXT_FINDINGS[key] = out
    return _first_of_each(_TEXT_FINDINGS[key] + imports)


_TEXT_FINDINGS = {}  # (path, sha1 of the text) -> findings that depend on the text alone


def _first_of_each(findings: list) -> list:
    """One finding per kind and name (pyflakes reports every use of an undefined name); the
    duplicate and syntax findings, which name their own lines, all stay."""
    seen, out = set(), []
    for f in sorted(findings, key=lambda f: f.line):
        if f.what in ("syntax", "duplicate") or f.key not in seen:
            seen.add(f.key)
            out.append(f)
    return out


def _indexes(repo, revs) -> dict:
    """One ``ModuleIndex`` per revision (shared by the files of one check)."""
    return {rev: ModuleIndex(repo, rev) for rev in revs}


def read_blobs(repo, specs: list) -> dict:
    """``{"rev:path": text or None}`` for many blobs in one ``git cat-file --batch`` call."""
    return {spec: None if found is None else found[2].decode("utf-8", "replace")
            for spec, found in cat_objects(repo, specs).items()}


def blob_ids(repo, specs: list) -> dict:
    """``{"rev:path": blob id or ""}`` in one ``git cat-file --batch-check`` call."""
    if not specs:
        return {}
    out = git("cat-file", "--batch-check=%(objectname)", cwd=repo, input="".join(f"{s}\n" for s in specs))
    return {spec: ("" if line.endswith(" missing") or line.endswith(" ambiguous") else line.strip())
            for spec, line in zip(specs, out.splitlines())}


def python_files_changed(repo, parent: str, commit: str) -> list:
    out = git("diff-tree", "-r", "--name-only", "--no-renames", "--diff-filter=AMR", "--no-commit-id",
              parent, commit, cwd=repo)
    return [p for p in out.split() if p.endswith(".py")]


def _new_findings(repo, path: str, text: str, baselines, rev: str, indexes=None, imports_only=False) -> list:
    """Findings in ``text`` (``path`` at revision ``rev``) not present in the baselines' version of
    ``path``, each checked against its own revision's tree (read only when needed)."""
    indexes = indexes if indexes is not None else {}
    for r in (rev, *baselines):
        indexes.setdefault(r, ModuleIndex(repo, r))
    found = lint_source(path, text, indexes[rev], imports_only)
    if not found or not baselines:
        return found
    blobs = read_blobs(repo, [f"{b}:{path}" for b in baselines])
    known = set()
    for b in baselines:
        ref_text = blobs.get(f"{b}:{path}")
        if ref_text is not None:
            known |= {f.key for f in lint_source(path, ref_text, indexes[b], imports_only)}
    return [f for f in found if f.key not in known]


def lint_change(repo, parent: str, commit: str, baselines=()) -> list:
    """New findings in the Python files ``parent..commit`` touches.

    ``baselines``: revisions whose version of each file is the reference (findings present there
    too are not reported), e.g. the new upstream base and the patch's old commit.
    """
    paths = python_files_changed(repo, parent, commit)
    blobs = read_blobs(repo, [f"{commit}:{p}" for p in paths])
    found, indexes = [], {}
    for p in paths:
        text = blobs.get(f"{commit}:{p}")
        if text is not None:
            found += _new_findings(repo, p, text, baselines, commit, indexes)
    return found


def first_broken(repo, base: str, head: str, baselines_of) -> tuple:
    """Walk the commits ``base..head`` (oldest first) and return ``(commit, parent, findings)`` of
    the first whose Python files have new findings, else None. ``baselines_of(commit)`` gives the
    reference revisions of one commit. Two git calls for the whole range, however long, besides
    the range's log (``chain_log``, which a bump has already run for its own bookkeeping)."""
    from tools.rebase.stack.stack import chain_log

    steps, ids = [], {}
    for c in chain_log(repo, base, head):
        paths = []
        for line in c.raw.splitlines():  # ":<old mode> <new mode> <old id> <new id> <status>\t<path>"
            meta, _, path = line.partition("\t")
            fields = meta.split()
            if line.startswith(":") and len(fields) == 5 and fields[4][:1] in "AMR" and path.endswith(".py"):
                paths.append(path)
                ids[f"{c.commit}:{path}"] = fields[3]  # the merged file's blob id
        steps.append((c.commit, paths))
    # A merged file identical to a reference version (the patch's old result, or upstream's file)
    # cannot hold a new finding of its own text: only its imports, which resolve against another
    # tree now, are checked again.
    refs = {c: tuple(baselines_of(c)) for c, _ in steps}
    ids.update(blob_ids(repo, [f"{rev}:{p}" for c, paths in steps for p in paths for rev in refs[c]]))
    same = {f"{c}:{p}" for c, paths in steps for p in paths
            if ids[f"{c}:{p}"] in {ids[f"{rev}:{p}"] for rev in refs[c]}}
    blobs = read_blobs(repo, [f"{c}:{p}" for c, paths in steps for p in paths if ids[f"{c}:{p}"]])
    parent, indexes = base, {}
    for commit, paths in steps:
        found = []
        for p in paths:
            text = blobs.get(f"{commit}:{p}")
            if text is not None:
                found += _new_findings(repo, p, text, baselines_of(commit), commit, indexes,
                                       imports_only=f"{commit}:{p}" in same)
        if found:
            return commit, parent, found
        parent = commit
    return None


def lint_worktree(repo, paths: list, baselines=()) -> list:
    """Like ``lint_change`` for files as they are in ``repo``'s working tree (a resolution)."""
    from pathlib import Path

    found = []
    blobs = read_blobs(repo, [f"{rev}:{p}" for p in paths for rev in baselines])
    # The files are resolved against HEAD (the stack so far, under the resolution being made).
    indexes = _indexes(repo, ("HEAD", *baselines))
    for p in paths:
        if not p.endswith(".py"):
            continue
        f = Path(repo) / p
        if not f.is_file():
            continue
        known = set()
        for rev in baselines:
            ref_text = blobs.get(f"{rev}:{p}")
            if ref_text is not None:
                known |= {x.key for x in lint_source(p, ref_text, indexes[rev])}
        found += [x for x in lint_source(p, f.read_text(errors="replace"), indexes["HEAD"]) if x.key not in known]
    return found


def lint_stack(repo, base: str, tip: str, baselines=()) -> list:
    """New findings in every Python file ``base..tip`` touches, as it is at ``tip`` (the finished
    stack): what one patch broke in a file another patch touched shows up here."""
    found = lint_change(repo, base, tip, baselines=baselines)
    return sorted(found, key=lambda f: (f.path, f.line))
