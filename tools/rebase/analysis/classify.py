"""Pair the commits of an old and a new stack and give every mapping line a status.

``git range-diff`` pairs commits one to one and calls context drift "modified"; here its pairing
is only one signal among several (stable ``Patch-Name`` identity first, then range-diff, equal
patch-ids, overlap of changed lines, equal subjects), and groups are found on top of the pairs:
an old commit whose changed lines mostly live in another new commit was merged into it; a new
commit whose lines mostly come from an already paired old commit was split out of it. Several old
commits in one new commit are a squash ("merged") or unrelated commits put together ("regrouped"):
``regroup`` tells which.
"""

import difflib
import re
from collections import Counter
from dataclasses import dataclass, field

from tools.rebase.git import prefetch
from tools.rebase.analysis import attribution, decompose, inbase, messages, regroup
from tools.rebase.analysis.diffparse import overlap
from tools.rebase.git.gitcmd import git_proc
from tools.rebase.analysis.subjects import normalized, strip_numbering

STATUSES = ("identical", "refreshed", "modified", "message-only", "renumbered", "absorbed",
            "likely-absorbed", "dropped", "new", "merged", "regrouped", "split", "reordered", "unreached")
PAIR_THRESHOLD = 0.5  # overlap / larger patch, for one-to-one pairing by content
_RANGE_DIFF_LINE = re.compile(
    r"^\s*(?P<a>\d+|-+):\s+(?P<ah>[0-9a-f]+|-+)\s+(?P<op>[=!<>])\s+(?P<b>\d+|-+):\s+(?P<bh>[0-9a-f]+|-+)"
)


@dataclass
class Row:
    status: str
    old: list  # [Commit]
    new: list  # [Commit]
    notes: list = field(default_factory=list)
    interdiff: str = ""
    upstream: str = ""  # absorbing upstream commit, when known
    edges: list = field(default_factory=list)  # [(old number, new number, lines, share of old, share of new)]
    folded: list = field(default_factory=list)  # [Commit]: new commits holding an absorbed commit's rest
    partial: bool = False  # absorbed: only part of it is in the new base


def _range_diff(repo, old_range: str, new_range: str, creation_factor: int):
    return git_proc("range-diff", "--no-color", "--no-patch", f"--creation-factor={creation_factor}",
                    old_range, new_range, cwd=repo)


def prefetch_range_diff(repo, old_base, old_tip, new_base, new_tip, creation_factor: int = 80) -> None:
    """Run the range-diff of these two ranges in the background for ``range_diff_pairs``."""
    if prefetch.immutable(old_base, old_tip, new_base, new_tip):
        args = (str(repo), f"{old_base}..{old_tip}", f"{new_base}..{new_tip}", creation_factor)
        prefetch.start(("range-diff", *args), _range_diff, repo, *args[1:])


def range_diff_pairs(repo, old_range: str, new_range: str, creation_factor: int = 80):
    """``[(old index, new index)]`` (0-based) that ``git range-diff`` pairs, and its raw output."""
    found, proc = prefetch.take(("range-diff", str(repo), old_range, new_range, creation_factor))
    if not found:
        proc = _range_diff(repo, old_range, new_range, creation_factor)
    pairs = []
    if proc.returncode != 0:
        return pairs, ""
    for line in proc.stdout.splitlines():
        m = _RANGE_DIFF_LINE.match(line)
        if m and m["op"] in "=!" and m["a"].isdigit() and m["b"].isdigit():
            pairs.append((int(m["a"]) - 1, int(m["b"]) - 1))
    return pairs, proc.stdout


def _lines(diff: str, prefix: str) -> list:
    out = []
    for line in diff.split("\n"):
        if line.startswith(prefix):
            out.append(line.split(" @@")[0] if prefix == "@@" else line)
    return out


def interdiff(old, new) -> str:
    """A compact diff of the two patches' changed lines, file by file (context lines left out)."""
    ok, nk = old.key, new.key
    out = []
    for path in sorted(set(ok) | set(nk)):
        a, b = list(ok.get(path, ())), list(nk.get(path, ()))
        if a == b:
            continue
        if not a:
            out.append(f"{path}: only in the new patch")
        elif not b:
            out.append(f"{path}: only in the old patch")
        diff = list(difflib.unified_diff(a, b, f"old/{path}", f"new/{path}", n=1, lineterm=""))
        out.extend(diff)
    return "\n".join(out)


def _lis(seq):
    """Indices (into ``seq``) of one longest strictly increasing subsequence, deterministic."""
    if not seq:
        return set()
    tails, prev, tails_idx = [], [-1] * len(seq), []
    import bisect

    for i, v in enumerate(seq):
        k = bisect.bisect_left(tails, v)
        if k == len(tails):
            tails.append(v)
            tails_idx.append(i)
        else:
            tails[k] = v
            tails_idx[k] = i
        prev[i] = tails_idx[k - 1] if k > 0 else -1
    out, i = set(), tails_idx[-1]
    while i != -1:
        out.add(i)
        i = prev[i]
    return out


def same_subject(o, n) -> bool:
    """Equal subjects, or subjects equal once numbering is stripped and confirmed by content (the
    two commits touch a common file)."""
    if o.subject == n.subject:
        return True
    return normalized(o.subject) == normalized(n.subject) and bool(
        {f.path for f in o.files} & {f.path for f in n.files})


def pair(old: list, new: list, rd_pairs=(), in_base=None) -> tuple:
    """One-to-one pairs ``{old index: new index}`` plus the line attribution (``attribution``)
    whose kept edges link commits into groups. ``in_base``: old lines the new base has (``inbase``),
    which never count as content shared with a new commit."""
    in_base = in_base or {}
    o2n, n2o = {}, {}

    def link(i, j):
        o2n[i] = j
        n2o[j] = i

    names_new = {}
    for j, c in enumerate(new):
        if c.name:
            names_new.setdefault(c.name, j)
    for i, c in enumerate(old):
        j = names_new.get(c.name) if c.name else None
        if j is not None and j not in n2o:
            link(i, j)
    for i, j in rd_pairs:
        if i < len(old) and j < len(new) and i not in o2n and j not in n2o:
            # range-diff may pair unrelated commits when one side carries a stable name
            if old[i].name and new[j].name and old[i].name != new[j].name:
                continue
            link(i, j)
    for i, c in enumerate(old):
        if i in o2n or not c.patch_id:
            continue
        for j, d in enumerate(new):
            if j not in n2o and d.patch_id == c.patch_id:
                link(i, j)
                break
    tokens_old = [Counter(_minus(c.tokens, in_base.get(i))) for i, c in enumerate(old)]
    tokens_new = [c.token_counts for c in new]
    holders = {}  # token -> new indices holding it: only pairs sharing a token are measured
    for j, counts in enumerate(tokens_new):
        for t in counts:
            holders.setdefault(t, []).append(j)
    common = {}
    for i, counts in enumerate(tokens_old):
        for j in sorted({j for t in counts for j in holders.get(t, ())}):
            common[(i, j)] = overlap(counts, tokens_new[j])
    size_old = [sum(c.values()) for c in tokens_old]
    size_new = [sum(c.values()) for c in tokens_new]
    scored = []
    for (i, j), n in common.items():
        if i in o2n or j in n2o:
            continue
        if old[i].name and new[j].name and old[i].name != new[j].name:
            continue
        score = n / max(size_old[i], size_new[j])
        if score >= PAIR_THRESHOLD:
            scored.append((-score, i, j))
    for _, i, j in sorted(scored):
        if i not in o2n and j not in n2o:
            link(i, j)
    for i, c in enumerate(old):
        if i in o2n:
            continue
        for j, d in enumerate(new):
            if j not in n2o and same_subject(c, d) and not (c.name and d.name and c.name != d.name):
                link(i, j)
                break
    return o2n, attribution.attribute(old, new, o2n, in_base)


def _minus(tokens: list, gone) -> list:
    """``tokens`` without (as many copies of) the tokens counted in ``gone``."""
    if not gone:
        return tokens
    left = dict(gone)
    out = []
    for t in tokens:
        if left.get(t, 0) > 0:
            left[t] -= 1
        else:
            out.append(t)
    return out


def classify(old: list, new: list, rd_pairs=(), absorbed=None, dropped=(), likely=None, in_base=None) -> list:
    """Return the mapping rows (unordered is fine; ``order_rows`` sorts them).

    ``absorbed``: ``{old index: (upstream commit or "", how)}`` for old commits known or found to
    be in the new base; ``dropped``: old indices the maintainer removed on purpose; ``likely``:
    ``{old index: (upstream commit, subject, evidence)}`` for re-implementations upstream;
    ``in_base``: ``{old index: Counter}`` of added lines the new base has (``inbase``). An absorbed
    old commit without a one-to-one partner joins no group: its remainder is noted where it went.
    """
    absorbed = absorbed or {}
    likely = likely or {}
    o2n, att = pair(old, new, rd_pairs, in_base)
    first = {i for i in absorbed if i not in o2n}  # absorption weighs before regrouping
    groups = att.links
    # Connected components over pairs + group links.
    parent = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a, b):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    for i, j in o2n.items():
        union(("o", i), ("n", j))
    for i, j in groups:
        if i in dropped or i in first:
            continue
        union(("o", i), ("n", j))
    comps = {}
    for i in range(len(old)):
        comps.setdefault(find(("o", i)), []).append(("o", i))
    for j in range(len(new)):
        comps.setdefault(find(("n", j)), []).append(("n", j))
    rows = []
    singles = []
    kept = list(o2n.items()) + [(i, j) for i, j in groups if i not in dropped and i not in first]
    cut_notes = {}
    parts = [p for m in comps.values() for p in decompose.parts(m, kept, att, o2n, old, new)]
    carried = {i for members, _ in parts if any(side == "n" for side, _ in members)
               for side, i in members if side == "o"}  # old commits some new commit carries
    squashed = {k: notes for k, notes in att.notes_old.items() if any("squashed" in n for n in notes)}
    for members, notes in parts:
        olds = sorted(i for side, i in members if side == "o")
        news = sorted(j for side, j in members if side == "n")
        if olds and news and (len(olds) > 1 or len(news) > 1):
            status, note = regroup.status(olds, news, old, new, carried - set(olds), squashed)
            row = Row(status, [old[i] for i in olds], [new[j] for j in news], [note])
            row.edges = attribution.group_edges(att, olds, news, o2n, old, new)
            row.notes.append(attribution.describe_edges(row.edges))
            row.notes.extend(notes)
            rows.append(row)
        elif olds and news:
            singles.append((olds[0], news[0]))
            cut_notes[(olds[0], news[0])] = notes
        elif olds:
            i = olds[0]
            if i in dropped:
                rows.append(Row("dropped", [old[i]], [], ["removed on purpose by the maintainer"]))
            elif i in absorbed:
                rows.append(inbase.absorbed_row(Row, i, absorbed[i], old, new, att, in_base))
            elif i in likely:
                commit, subject, how = likely[i]
                note = f"likely absorbed by {commit[:12]} ({subject}): {how}"
                rows.append(Row("likely-absorbed", [old[i]], [], [note], upstream=commit))
            else:
                rows.append(Row("dropped", [old[i]], [], ["not in the new stack, not found upstream"]))
        else:
            rows.append(Row("new", [], [new[news[0]]], ["new patch"]))
    singles.sort()
    in_order = _lis([j for _, j in singles])
    for k, (i, j) in enumerate(singles):
        rows.append(_classify_pair(old[i], new[j], reordered=k not in in_order))
        rows[-1].notes.extend(cut_notes.get((i, j), []))
    attribution.add_commit_notes(rows, att, old, new)
    inbase.note_holders(rows)
    return rows


def _classify_pair(o, n, reordered: bool) -> Row:
    semantic_same = o.key == n.key
    exact_same = semantic_same and o.patch_id == n.patch_id
    # A series counter ("[8/8] ...") and attribution trailers (Signed-off-by, ...) are not wording.
    message_same = messages.core(o.message) == messages.core(n.message)
    trailers = messages.trailer_change(o.message, n.message) if message_same else ""
    counter_only = message_same and o.subject != n.subject
    moved = o.number != n.number
    notes = []
    if not semantic_same:
        status = "modified"
        notes.append("the change itself differs")
    elif not message_same:
        status = "message-only"
        notes.append("commit message edited" if o.subject == n.subject else "subject edited")
    elif reordered:
        status = "reordered"
        notes.append(f"moved from #{o.number} to #{n.number}")
    elif not exact_same:
        status = "refreshed"
        notes.append("context/offsets moved; same added/removed lines")
    elif moved:
        status = "renumbered"
        notes.append(f"#{o.number} -> #{n.number}")
    else:
        status = "identical"
        notes.append("same patch-id")
    if status in ("identical", "renumbered", "reordered") and exact_same:
        if _lines(o.diff, "@@") != _lines(n.diff, "@@"):
            notes.append("hunk offsets moved")
        elif _lines(o.diff, "index ") != _lines(n.diff, "index "):
            notes.append("upstream changed the file elsewhere")
    if status != "message-only" and not message_same:
        notes.append("message edited too")
    if counter_only:
        notes.append(f"series counter {_counter(o.subject)} -> {_counter(n.subject)}")
    if trailers:
        notes.append(trailers)
    if status not in ("reordered", "renumbered") and (reordered or moved):
        notes.append(f"{'reordered' if reordered else 'renumbered'} #{o.number} -> #{n.number}")
    if status == "reordered" and not exact_same:
        notes.append("context/offsets moved")
    row = Row(status, [o], [n], notes)
    if status == "modified":
        row.interdiff = interdiff(o, n)
    return row


def _counter(subject: str) -> str:
    prefix = subject[: len(subject) - len(strip_numbering(subject))].strip() if subject.strip() else ""
    return prefix or "none"


def order_rows(rows: list) -> list:
    """Stable order: by the first new commit; rows with only old commits right after the row
    holding the closest earlier old commit."""
    placed = [r for r in rows if r.new]
    placed.sort(key=lambda r: min(c.number for c in r.new))
    orphans = sorted((r for r in rows if not r.new), key=lambda r: r.old[0].number)
    out = list(placed)
    for r in orphans:
        num = r.old[0].number
        pos = 0
        for k, other in enumerate(out):
            if other.old and min(c.number for c in other.old) < num:
                pos = k + 1
        out.insert(pos, r)
    return out
