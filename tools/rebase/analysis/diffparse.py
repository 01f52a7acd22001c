"""Commits of a stack as data: message, files, +/- lines per file and a stable patch-id.

The report compares patches by what they change, not by how the diff happens to look: only
the added/removed lines of each hunk count ("semantic key"); context lines, ``@@`` offsets and
``index`` lines do not. ``git patch-id --stable`` (which does include context) separates
identical from refreshed.
"""

import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from tools.rebase.git import prefetch
from tools.rebase.git.gitcmd import git
from tools.rebase.stack.series import parse_trailers, test_ids

_SEP_COMMIT = "\x01"
_SEP_BODY = "\x02"
_SEP_DIFF = "\x03"
# Header lines of a file diff that change what the patch does (not how it is displayed).
_MEANINGFUL_HEADERS = ("new file mode", "deleted file mode", "old mode", "new mode",
                       "rename from", "rename to", "copy from", "copy to", "Binary files")


@dataclass
class FileDiff:
    path: str
    old_path: str
    signed: list = field(default_factory=list)  # "+line" / "-line" / "#header" in order
    added: int = 0
    removed: int = 0


@dataclass
class Commit:
    commit: str
    subject: str
    message: str
    diff: str
    files: list  # [FileDiff] in diff order
    number: int = 0  # 1-based position in its stack
    patch_id: str = ""

    def trailer(self, key: str) -> str:
        """First value of trailer ``key`` in the message, or ""."""
        return parse_trailers(self.message).get(key, [""])[0]

    @property
    def name(self) -> str:
        return self.trailer("Patch-Name")

    @property
    def tests(self) -> list:
        return test_ids(parse_trailers(self.message))

    @property
    def key(self) -> dict:
        """What the patch changes: path -> tuple of signed lines (context and offsets ignored)."""
        return {f.path: tuple(f.signed) for f in self.files}

    @cached_property
    def tokens(self) -> list:
        """Signed non-blank lines, for overlap measures between patches (computed once: a Commit's
        files do not change after parsing)."""
        out = []
        for f in self.files:
            for line in f.signed:
                if line[:1] in "+-" and line[1:].strip():
                    out.append(line[0] + line[1:].strip())
        return out

    @cached_property
    def token_set(self) -> frozenset:
        return frozenset(self.tokens)

    @cached_property
    def token_counts(self) -> Counter:
        """``tokens`` as a multiset (callers must not change it)."""
        return Counter(self.tokens)

    @property
    def added(self) -> int:
        return sum(f.added for f in self.files)

    @property
    def removed(self) -> int:
        return sum(f.removed for f in self.files)


def parse_diff(text: str) -> list:
    """Split a ``git diff``/``git show`` patch into FileDiffs with their signed lines."""
    files = []
    current = None
    in_hunk = False
    for line in text.split("\n"):
        if line.startswith("diff --git "):
            m = re.match(r'^diff --git "?a/(.*?)"? "?b/(.*?)"?$', line)
            old_path, path = (m.group(1), m.group(2)) if m else (line, line)
            current = FileDiff(path=path, old_path=old_path)
            files.append(current)
            in_hunk = False
            continue
        if current is None:
            continue
        if line.startswith("@@"):
            in_hunk = True
            continue
        if in_hunk:
            if line.startswith("+"):
                current.signed.append(line.rstrip())
                current.added += 1
            elif line.startswith("-"):
                current.signed.append(line.rstrip())
                current.removed += 1
            elif line.startswith(" ") or line.startswith("\\") or line == "":
                continue
            else:
                in_hunk = False
        if not in_hunk and line.startswith(_MEANINGFUL_HEADERS):
            current.signed.append("#" + line)
    return files


def list_range(repo: Path, base: str, tip: str) -> list:
    """The commits of ``base..tip`` oldest first, with messages, diffs and patch-ids."""
    commits, _ = read_range(repo, base, tip)
    fill_patch_ids(repo, commits)
    return commits


def range_log(repo: Path, base: str, tip: str) -> str:
    """The raw ``git log -p`` of ``base..tip`` that ``read_range`` parses."""
    return git(
        "log", "--reverse", "--no-color", "--full-index", "-p", "--no-ext-diff",
        f"--format={_SEP_COMMIT}%H %P{_SEP_BODY}%B{_SEP_DIFF}", f"{base}..{tip}", cwd=repo,
    )


def prefetch_range(repo: Path, base: str, tip: str) -> None:
    """Read ``base..tip``'s log in the background for the next ``read_range`` of that range."""
    if prefetch.immutable(base, tip):
        prefetch.start(("log", str(repo), base, tip), range_log, repo, base, tip)


def read_range(repo: Path, base: str, tip: str):
    """``(commits, merges)`` of ``base..tip``: the non-merge commits oldest first, with messages
    and diffs but no patch-ids yet (``fill_patch_ids`` does several ranges in one call), and the
    merge commits' ids, newest first (as ``git rev-list --merges`` lists them)."""
    found, out = prefetch.take(("log", str(repo), base, tip))
    if not found:
        out = range_log(repo, base, tip)
    commits, merges = [], []
    for chunk in out.split(_SEP_COMMIT)[1:]:
        ids, _, rest = chunk.partition(_SEP_BODY)
        sha, *parents = ids.split()
        if len(parents) > 1:
            merges.insert(0, sha)
            continue
        message, _, diff = rest.partition(_SEP_DIFF)
        message = message.strip("\n")
        subject = message.splitlines()[0] if message else ""
        diff = diff.strip("\n")
        commits.append(Commit(sha, subject, message, diff, parse_diff(diff), len(commits) + 1))
    return commits, merges


def fill_patch_ids(repo: Path, commits: list) -> None:
    """Set ``patch_id`` of every commit, in one ``git patch-id`` call."""
    if not commits:
        return
    feed = "".join(f"commit {c.commit}\n\n{c.diff}\n" for c in commits if c.diff)
    if not feed:
        return
    out = git("patch-id", "--stable", cwd=repo, input=feed)
    ids = {}
    for line in out.splitlines():
        pid, _, sha = line.partition(" ")
        ids[sha.strip()] = pid
    for c in commits:
        c.patch_id = ids.get(c.commit, "")


def patch_ids_of(repo: Path, diffs: dict) -> dict:
    """``{label: diff text}`` -> ``{label: stable patch-id}`` (labels must be 40-hex-like)."""
    feed = "".join(f"commit {label}\n\n{text}\n" for label, text in diffs.items() if text)
    if not feed:
        return {}
    out = git("patch-id", "--stable", cwd=repo, input=feed)
    return {sha.strip(): pid for pid, _, sha in (line.partition(" ") for line in out.splitlines())}


def upstream_commits(repo: Path, old: str, new: str, paths: list) -> list:
    """Commits of ``old..new`` touching ``paths``, oldest first, as Commit objects (path-limited diffs)."""
    if not paths:
        return []
    out = git(
        "log", "--reverse", "--no-merges", "--no-color", "--full-index", "-p",
        f"--format={_SEP_COMMIT}%H{_SEP_BODY}%B{_SEP_DIFF}", f"{old}..{new}", "--", *paths, cwd=repo,
    )
    commits = []
    for chunk in out.split(_SEP_COMMIT)[1:]:
        sha, _, rest = chunk.partition(_SEP_BODY)
        message, _, diff = rest.partition(_SEP_DIFF)
        message = message.strip("\n")
        diff = diff.strip("\n")
        commits.append(Commit(sha, message.splitlines()[0] if message else "", message, diff,
                              parse_diff(diff)))
    return commits


def overlap(a, b) -> int:
    """Size of the multiset intersection of two token lists (or Counters of them)."""
    ca = a if isinstance(a, Counter) else Counter(a)
    cb = b if isinstance(b, Counter) else Counter(b)
    if len(cb) < len(ca):
        ca, cb = cb, ca
    return sum(min(n, cb[t]) for t, n in ca.items() if t in cb)


def find_absorbing_commit(repo: Path, patch: Commit, candidates: list):
    """Name the upstream commit that carries ``patch``: same patch-id on the patch's files, else the
    commit holding most of the patch's lines (at least half). Returns (commit, how) or (None, "")."""
    if not candidates:
        return None, ""
    paths = [f.path for f in patch.files]
    wanted = set(paths)
    limited = {}
    for c in candidates:
        if not any(f.path in wanted or f.old_path in wanted for f in c.files):
            continue  # no diff of its files: no patch-id to match
        text = _restrict(c.diff, paths)
        if text:
            limited[c.commit] = text
    own = patch_ids_of(repo, {"0" * 40: patch.diff}).get("0" * 40)
    ids = patch_ids_of(repo, limited)
    for c in candidates:
        if own and ids.get(c.commit) == own:
            return c.commit, "same patch-id"
    tokens = patch.tokens
    plus = Counter(t for t in tokens if t[0] == "+")
    best, best_n = None, 0
    mine = patch.token_counts
    for c in candidates:
        if c.token_set.isdisjoint(mine):
            continue
        n = overlap(mine, c.token_counts)
        # removing the same old line is no absorption: upstream must add most of what the patch adds
        if n > best_n and 2 * overlap(plus, c.token_counts) >= sum(plus.values()):
            best, best_n = c.commit, n
    if tokens and best_n * 2 >= len(tokens):
        return best, f"{best_n}/{len(tokens)} changed lines"
    return None, ""


def _restrict(diff: str, paths: list) -> str:
    keep, out = False, []
    wanted = set(paths)
    for line in diff.split("\n"):
        if line.startswith("diff --git "):
            m = re.match(r'^diff --git "?a/(.*?)"? "?b/(.*?)"?$', line)
            keep = bool(m) and (m.group(1) in wanted or m.group(2) in wanted)
        if keep:
            out.append(line)
    return "\n".join(out)
