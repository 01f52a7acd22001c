"""What dropping a patch leaves behind: later patches built on its lines, and orphaned tests.

A later patch depends on a dropped one when lines of its hunks' old side (context or removed
lines) were written by the dropped patch: blame the later patch's parent in the old stack over
``old_base..parent`` for exactly those lines. Its ``Tests:`` files that no other patch of the
stack names are orphaned: nothing proves them any more, and they test code that is gone.
"""

import re

from tools.rebase.git.gitcmd import git_proc

_HUNK_OLD = re.compile(r"^@@ -(\d+)(?:,(\d+))? ")


def _old_side_ranges(repo, commit: str) -> dict:
    """``{path: [(start, count)]}`` of the lines each hunk of ``commit`` reads from its parent."""
    proc = git_proc("show", "--no-color", "--format=", "-U3", "--no-renames", commit, cwd=repo)
    out, path = {}, None
    for line in proc.stdout.splitlines():
        if line.startswith("--- "):
            path = line[6:] if line.startswith("--- a/") else None
        m = _HUNK_OLD.match(line)
        if m and path:
            count = int(m[2]) if m[2] is not None else 1
            if count:
                out.setdefault(path, []).append((int(m[1]), count))
    return out


def _files(repo, commit: str) -> set:
    proc = git_proc("diff-tree", "--no-commit-id", "--name-only", "-r", "--no-renames", commit, cwd=repo)
    return set(proc.stdout.split())


def context_dependents(repo, base: str, commits: list, idx: int) -> list:
    """Indices of the patches after ``idx`` (in ``commits``, the old stack on ``base``) whose hunks
    rest on lines that patch ``idx`` wrote."""
    dropped = commits[idx]
    touched = _files(repo, dropped)
    out = []
    for k in range(idx + 1, len(commits)):
        ranges = _old_side_ranges(repo, commits[k])
        hit = False
        for path in sorted(set(ranges) & touched):
            args = ["blame", "--porcelain"]
            for start, count in ranges[path]:
                args += ["-L", f"{start},{start + count - 1}"]
            proc = git_proc(*args, f"{base}..{commits[k - 1]}", "--", path, cwd=repo)
            if any(line.startswith(dropped + " ") for line in proc.stdout.splitlines()):
                hit = True
                break
        if hit:
            out.append(k)
    return out


def orphaned_tests(tests_of: dict, name: str) -> list:
    """Test files named by patch ``name``'s ``Tests:`` and by no other patch (``tests_of``:
    ``{patch name: [node ids]}``)."""
    def files(ids):
        return {node.split("::", 1)[0] for node in ids}

    others = set().union(*(files(ids) for n, ids in tests_of.items() if n != name)) if tests_of else set()
    return sorted(files(tests_of.get(name, [])) - others)


def drop_note(names: list, dependents: list, orphans: list) -> str:
    parts = ["removed on purpose by the maintainer"]
    if dependents:
        parts.append("later patches built on its lines: " + ", ".join(names[k] for k in dependents))
    if orphans:
        parts.append("its Tests: files are now orphaned: " + ", ".join(orphans))
    return "; ".join(parts)
