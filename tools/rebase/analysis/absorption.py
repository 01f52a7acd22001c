"""Name the upstream commits behind a partial absorption, or an absorption in pieces.

When the new version of a patch lacks part of the old one, the report should say where that part
went: upstream made the same change (a commit whose changed lines hold most of the missing lines),
or deleted or moved the file. When a whole patch vanished and no single upstream commit carries it,
several commits may each have taken a piece: a greedy cover of its changed lines names them.
"""

from collections import Counter

from tools.rebase.analysis.diffparse import overlap
from tools.rebase.git.gitcmd import git_proc

PIECES_COVERAGE = 0.8  # share of a patch's changed lines the named commits must cover together


def _tokens(signed) -> list:
    return [line[0] + line[1:].strip() for line in signed if line[:1] in "+-" and line[1:].strip()]


def _minus(a: list, b: list) -> list:
    """Multiset difference a - b."""
    left = {}
    for t in b:
        left[t] = left.get(t, 0) + 1
    out = []
    for t in a:
        if left.get(t, 0):
            left[t] -= 1
        else:
            out.append(t)
    return out


def _moved_to(repo, commit: str, path: str) -> str:
    proc = git_proc("show", "-M", "--name-status", "--format=", commit, cwd=repo)
    for line in proc.stdout.splitlines():
        parts = line.split("\t")
        if parts[0].startswith("R") and len(parts) == 3 and parts[1] == path:
            return parts[2]
    return ""


def _file_tokens(commit, path: str) -> list:
    return [t for f in commit.files if f.path == path or f.old_path == path for t in _tokens(f.signed)]


def partial(repo, old, new, upstream: list) -> list:
    """``[(upstream commit, note)]`` for the parts of ``old`` missing from ``new``."""
    found = []
    new_files = {f.path: _tokens(f.signed) for f in new.files}
    for f in old.files:
        missing = _minus(_tokens(f.signed), new_files.get(f.path, []))
        if not missing:
            continue
        gone = f.path not in new_files
        hit = None
        if gone:
            for c in upstream:
                if any(u.path == f.path and any(x.startswith("#deleted file mode") for x in u.signed) for u in c.files):
                    target = _moved_to(repo, c.commit, f.path)
                    what = f"moved to `{target}`" if target else "deleted"
                    hit = (c.commit, f"`{f.path}` {what} upstream in {c.commit[:12]}")
        if hit is None:
            best, best_n = None, 0
            for c in upstream:
                n = overlap(missing, _file_tokens(c, f.path))
                if n > best_n:
                    best, best_n = c, n
            if best is not None and best_n * 2 >= len(missing):
                part = "its change to" if gone else f"{len(missing)} changed lines of"
                hit = (best.commit, f"{part} `{f.path}` made upstream in {best.commit[:12]}")
        if hit:
            found.append(hit)
    return found


def pieces(patch, upstream: list) -> list:
    """Upstream commits that together carry ``patch`` (greedy cover), or [] when they do not."""
    todo = patch.tokens
    total = len(todo)
    if not total:
        return []
    chosen = []
    while todo:
        best, best_n = None, 0
        left = set(todo)
        for c in upstream:
            if c.commit in chosen or left.isdisjoint(c.token_set):
                continue
            n = overlap(todo, c.token_counts)
            if n > best_n:
                best, best_n = c, n
        if best is None:
            break
        chosen.append(best.commit)
        todo = _minus(todo, best.tokens)
    covered = total - len(todo)
    return chosen if len(chosen) > 1 and covered >= PIECES_COVERAGE * total else []


def carrier(lines, upstream: list) -> str:
    """The upstream commit adding most of ``lines`` (a Counter of ``+text`` tokens), or ""."""
    wanted = Counter(lines)
    best, best_n = "", 0
    for c in upstream:
        n = overlap(wanted, c.token_counts)  # wanted holds only "+" tokens
        if n > best_n:
            best, best_n = c.commit, n
    return best
