"""Fingerprints of changed lines over an upstream range: who introduced the text that survives.

Two questions about upstream history need line-level answers. Which upstream commits really
changed a patch's lines between the bases: a commit whose change was reverted later (or that a
re-apply repeated), or that only re-wrapped a line, had no net effect and must not be named. And
where did a patch's lines go when upstream moved them into a file the stack never touched: one
``git log -p -U0`` over the whole range, indexed only for the lines asked about, answers it.
"""

import re
from collections import Counter
from dataclasses import dataclass, field

from tools.rebase.git import prefetch
from tools.rebase.git.gitcmd import git

_SEP_COMMIT = "\x01"
_SEP_BODY = "\x02"
MIN_TEXT = 6  # shorter lines (brackets, ``else:``) carry no evidence


def norm(text: str) -> str:
    """A line's text with all whitespace removed (re-indenting or re-spacing it changes nothing)."""
    return "".join(text.split())


def signed_norms(commit) -> list:
    """The commit's changed lines as ``sign + norm(text)``, in diff order, per file."""
    return [(f.path, line[0] + norm(line[1:])) for f in commit.files for line in f.signed
            if line[:1] in "+-" and len(norm(line[1:])) >= MIN_TEXT]


def effective(commit) -> Counter:
    """Changed lines that change something: a run of removed lines re-added as the same text
    (re-wrapped, re-indented, or removed and re-added in the same file) is left out."""
    out = Counter()
    for f in commit.files:
        runs, minus, plus = [], [], []
        for line in f.signed:
            if line[:1] not in "+-":
                continue
            if line[0] == "-" and plus:
                runs.append((minus, plus))
                minus, plus = [], []
            (minus if line[0] == "-" else plus).append(norm(line[1:]))
        runs.append((minus, plus))
        removed = Counter(t for m, _ in runs for t in m)
        added = Counter(t for _, p in runs for t in p)
        for m, p in runs:
            if m and p and "".join(m) == "".join(p):
                for t in m:
                    removed[t] -= 1
                for t in p:
                    added[t] -= 1
        for t in set(removed) | set(added):
            both = min(max(removed[t], 0), max(added[t], 0))
            for sign, n in (("-", removed[t] - both), ("+", added[t] - both)):
                if n > 0 and len(t) >= MIN_TEXT:
                    out[sign + t] += n
    return out


class UpstreamLines:
    """The upstream commits of a range (oldest first) with their effective changed lines."""

    def __init__(self, commits: list):
        self.commits = commits
        self.effective = [effective(c) for c in commits]
        self.last = {}  # signed text -> index of the last commit making that change
        for k, eff in enumerate(self.effective):
            for t in eff:
                self.last[t] = k
        self._norms = None  # per commit: the set of its signed_norms texts, built on first use
        self._live = {}  # patch commit -> live(patch)

    def _flip(self, t: str) -> str:
        return ("-" if t[0] == "+" else "+") + t[1:]

    def survives(self, k: int, t: str) -> bool:
        """Commit k's change ``t`` is still there at the new base (no later commit undid it)."""
        return t in self.effective[k] and self.last.get(self._flip(t), -1) < k

    def live(self, patch) -> list:
        """The commits with a surviving effect on ``patch``'s lines, or whose other changes do not
        touch them at all (they stay candidates for a same-patch-id match); commits whose effect
        on those lines is nil are left out."""
        if patch.commit in self._live:
            return self._live[patch.commit]
        wanted = {t for _, t in signed_norms(patch)}
        if self._norms is None:
            self._norms = [{t for _, t in signed_norms(c)} for c in self.commits]
        out = []
        for k, c in enumerate(self.commits):
            mine = wanted & self.effective[k].keys()
            touched = wanted & self._norms[k]
            if touched and not any(self.survives(k, t) for t in mine):
                continue  # it changed these lines, but the change was undone or only re-wrapped them
            out.append(c)
        self._live[patch.commit] = out
        return out


@dataclass
class RangeIndex:
    """Where the asked-for lines are added or removed in a whole upstream range."""
    commits: list = field(default_factory=list)  # [(commit, subject)] oldest first
    hits: dict = field(default_factory=dict)  # signed norm text -> [(commit index, path)]
    identifiers: dict = field(default_factory=dict)  # identifier -> {commit index}

    def surviving_adders(self, text: str) -> list:
        """``[(commit index, path)]``: the last commit adding ``text`` when nothing removed it later."""
        adds = self.hits.get("+" + text, [])
        if not adds:
            return []
        k = adds[-1][0]
        if any(r > k for r, _ in self.hits.get("-" + text, [])):
            return []
        return [(i, p) for i, p in adds if i == k]


def range_log(repo, old: str, new: str, suffixes=()) -> str:
    """``git log -p -U0`` of ``old..new`` (merges left out; every file, or those ending in one of
    ``suffixes``), the text ``scan_range`` indexes."""
    pathspec = ["--", *(f":(glob)**/*{s}" for s in sorted(set(suffixes)))] if suffixes else []
    return git("log", "--reverse", "--no-merges", "--no-color", "-p", "-U0", "--no-ext-diff",
               f"--format={_SEP_COMMIT}%H %s{_SEP_BODY}", f"{old}..{new}", *pathspec, cwd=repo)


def _log_key(repo, old: str, new: str, suffixes) -> tuple:
    return ("range-log-U0", str(repo), old, new, tuple(sorted(set(suffixes))))


def prefetch_range_log(repo, old: str, new: str, suffixes=()) -> bool:
    """Start ``range_log`` in the background; whoever started it must ``scan_range`` or
    ``drop_range_log`` it. False when the range is not immutable (nothing started)."""
    if not prefetch.immutable(old, new):
        return False
    prefetch.start(_log_key(repo, old, new, suffixes), range_log, repo, old, new, suffixes)
    return True


def drop_range_log(repo, old: str, new: str, suffixes=()) -> None:
    """Wait for a prefetched ``range_log`` nobody needs and forget it."""
    prefetch.take(_log_key(repo, old, new, suffixes))


def scan_range(repo, old: str, new: str, texts=(), identifiers=(), suffixes=()) -> RangeIndex:
    """Index ``range_log(old, new, suffixes)`` (prefetched or not) for ``texts`` (normalized line
    texts) and for the commits whose added lines name one of ``identifiers``."""
    found, out = prefetch.take(_log_key(repo, old, new, suffixes))
    if not found:
        out = range_log(repo, old, new, suffixes)
    wanted = set(texts)
    names = sorted(set(identifiers), key=lambda n: (-len(n), n))
    any_name = re.compile("|".join(re.escape(n) for n in names)) if names else None
    index = RangeIndex()
    path = ""
    k = -1
    run = ([], [], [])  # removed texts, added texts, pending hits of one change run

    def flush():
        minus, plus, pending = run
        if pending and not (minus and plus and "".join(minus) == "".join(plus)):  # not a re-wrap
            for key, where in pending:
                index.hits.setdefault(key, []).append(where)
        for part in run:
            part.clear()

    for line in out.split("\n"):
        first = line[:1]
        if first not in ("+", "-") or line.startswith(("+++ ", "--- ")):
            flush()
            if line.startswith(_SEP_COMMIT):
                sha, _, subject = line[1:].split(_SEP_BODY)[0].partition(" ")
                index.commits.append((sha, subject))
                k += 1
            elif line.startswith("+++ "):
                path = line[6:] if line.startswith("+++ b/") else path
            continue
        if first == "-" and run[1]:
            flush()
        text = norm(line[1:])
        (run[0] if first == "-" else run[1]).append(text)
        if text in wanted:
            run[2].append((first + text, (k, path)))
        if any_name is not None and first == "+" and any_name.search(line):
            for name in set(any_name.findall(line)):
                index.identifiers.setdefault(name, set()).add(k)
    flush()
    return index


def absorber(index: RangeIndex, patch, min_share: float = 0.5):
    """``(commit, subject, how)`` of the upstream commit that introduced most of ``patch``'s added
    lines as they stand at the new base, or None when none carries ``min_share`` of them."""
    texts = [t[1:] for _, t in signed_norms(patch) if t[0] == "+"]
    if not texts:
        return None
    per = Counter()
    paths = {}
    for text in texts:
        for k, p in index.surviving_adders(text)[:1]:
            per[k] += 1
            paths.setdefault(k, Counter())[p] += 1
    if not per:
        return None
    k, n = max(per.items(), key=lambda kv: (kv[1], kv[0]))
    if n < min_share * len(texts):
        return None
    sha, subject = index.commits[k]
    own = {f.path for f in patch.files}
    where = [p for p, _ in paths[k].most_common() if p not in own]
    how = f"{n}/{len(texts)} added lines"
    if where:
        how += f", moved into `{where[0]}`" + (f" and {len(where) - 1} more files" if len(where) > 1 else "")
    return sha, subject, how
