"""Which new commits the lines of each old commit went to: a bipartite attribution of added lines.

A split, a squash and a regroup are one shape seen from different sides: the added lines of a set
of old commits reappear in a set of new commits. Each added line of an old commit is credited to
the new commits that add the same line (first to the commit it is already paired with, the rest
shared out in proportion), every edge carrying enough of either side's lines is kept (no fixed
majority cut, so a part holding a fifth of a split is still an edge), and each connected group is
reported once with the share of lines each edge carries.

Lines a later commit of the same stack rewrote or reverted are followed too: a commit whose lines a
later one rewrote (then squashed into one new commit) joins the later one's group, and a commit that
removes lines an earlier commit of its stack added is noted as an in-stack revert.
"""

import re
from collections import Counter
from dataclasses import dataclass, field

from tools.rebase.analysis.subjects import echoes, names_other

EDGE_SHARE = 0.2  # an edge must carry this share of the old or the new commit's lines ...
EDGE_MIN_LINES = 2  # ... and at least this many lines, unless it carries half of one side
REWRITTEN_SHARE = 0.5  # share of a commit's added lines a later commit removed: "rewritten"
REVERT_SHARE = 0.5  # share of a commit's removed lines an earlier commit added: "in-stack revert"
_WORDY = re.compile(r"[A-Za-z0-9_]{3,}")


_IMPORT = re.compile(r"^(?:import\s|from\s+\S+\s+import\s)")
CROSS_MIN_LINES = 3  # an edge between two commits each paired elsewhere needs this many lines ...
CROSS_SHARE = 0.2  # ... and this share of both sides' lines
PART_SHARE = 0.4  # a commit folded into (split off) a paired one brings (holds) this share


def _wordy(text: str) -> bool:
    return len(text) >= 6 and bool(_WORDY.search(text))


def _meaningful(text: str) -> bool:
    """A line that can tell commits apart (not a bare bracket, ``else:``, ``return`` or an import
    many patches share)."""
    return _wordy(text) and not _IMPORT.match(text)


def sided(commit) -> tuple:
    """``(added, removed)``: Counters of the commit's meaningful line texts, computed once per
    commit (kept on the object; callers must not change them)."""
    cached = commit.__dict__.get("_sided_lines")
    if cached is None:
        plus, minus = Counter(), Counter()
        for t in commit.tokens:
            if _meaningful(t[1:]):
                (plus if t[0] == "+" else minus)[t[1:]] += 1
        if not plus and not minus:  # a commit of imports only: they are all it has to be traced by
            for t in commit.tokens:
                if _wordy(t[1:]):
                    (plus if t[0] == "+" else minus)[t[1:]] += 1
        cached = commit.__dict__["_sided_lines"] = (plus, minus)
    return cached


def signed_lines(commit) -> Counter:
    """The commit's own added lines (its removed ones when it adds nothing), whitespace-trimmed."""
    cached = commit.__dict__.get("_signed_lines")
    if cached is None:
        plus, minus = sided(commit)
        sign, lines = ("+", plus) if plus else ("-", minus)
        cached = commit.__dict__["_signed_lines"] = Counter({sign + t: n for t, n in lines.items()})
    return Counter(cached)  # a copy: callers subtract from it


def _flip(token: str) -> str:
    return ("-" if token[0] == "+" else "+") + token[1:]


@dataclass
class StackFlow:
    """Lines later commits of one stack took back: ``taken[k] = {m: n}`` means commit m removed n
    of commit k's added lines; ``reverts[m] = {k: n}`` the same seen from the remover."""
    taken: dict = field(default_factory=dict)
    reverts: dict = field(default_factory=dict)
    survivors: list = field(default_factory=list)  # [Counter] added lines still there at the tip


def stack_flow(commits: list) -> StackFlow:
    flow = StackFlow()
    live = []  # per commit: Counter of its added lines not yet removed
    for m, c in enumerate(commits):
        removed = Counter(sided(c)[1])
        for k in range(m - 1, -1, -1):  # the latest adder loses a line first
            if not removed:
                break
            for text in list(removed):
                n = min(removed[text], live[k].get(text, 0))
                if n:
                    live[k][text] -= n
                    removed[text] -= n
                    if not removed[text]:
                        del removed[text]
                    flow.taken.setdefault(k, Counter())[m] += n
                    flow.reverts.setdefault(m, Counter())[k] += n
        live.append(Counter(sided(c)[0]))
    flow.survivors = [Counter({"+" + t: n for t, n in c.items() if n > 0}) for c in live]
    return flow


@dataclass
class Attribution:
    edges: dict  # (old index, new index) -> lines credited (may be fractional)
    old_sizes: list
    new_sizes: list
    links: list  # [(old index, new index)] kept edges, then evidence links
    notes_old: dict = field(default_factory=dict)  # old index -> [note]
    notes_new: dict = field(default_factory=dict)

    def share(self, i: int, j: int) -> tuple:
        """``(lines, share of old i's lines, share of new j's lines)`` of the edge i -> j."""
        w = self.edges.get((i, j), 0)
        size_old, size_new = self.old_sizes[i], self.new_sizes[j]
        return w, w / size_old if size_old else 0.0, w / size_new if size_new else 0.0


def placed_lines(commit) -> dict:
    """``signed_lines`` as ``{token: Counter(path: copies)}``: where in the tree each line is."""
    cached = commit.__dict__.get("_placed_lines")
    if cached is None:
        wanted = signed_lines(commit)
        sign = next(iter(wanted))[0] if wanted else "+"
        cached = {}
        for f in commit.files:
            for line in f.signed:
                text = line[1:].strip()
                if line[:1] == sign and wanted.get(sign + text):
                    cached.setdefault(sign + text, Counter())[f.path] += 1
        commit.__dict__["_placed_lines"] = cached
    return {t: Counter(paths) for t, paths in cached.items()}


def _take(placed: dict, token: str, n: float, path: str = "") -> None:
    """Take ``n`` copies of ``token`` out of ``placed`` (``placed_lines``), ``path``'s first."""
    paths = placed.get(token, {})
    for p in sorted(paths, key=lambda q: (q != path, q)):
        m = min(n, paths[p])
        paths[p] -= m
        n -= m
        if n <= 1e-12:
            break


def _share(edges: Counter, left_old: list, left_new: list) -> None:
    """Each line copy left is shared in proportion among the new commits that hold it (keys of any
    kind: ``(path, token)`` or token), taken out of both sides."""
    holders_new = {}
    for j, c in enumerate(left_new):
        for t, n in c.items():
            if n > 1e-12:
                holders_new.setdefault(t, []).append(j)
    holders_old = {}
    for i, c in enumerate(left_old):
        for t, n in c.items():
            if n > 1e-12:
                holders_old.setdefault(t, []).append(i)
    for t, olds in holders_old.items():
        news = holders_new.get(t)
        if not news:
            continue
        total_old = sum(left_old[i][t] for i in olds)
        total_new = sum(left_new[j][t] for j in news)
        matched = min(total_old, total_new)
        for i in olds:
            for j in news:
                edges[(i, j)] += matched * left_old[i][t] / total_old * left_new[j][t] / total_new
        for i in olds:
            left_old[i][t] -= matched * left_old[i][t] / total_old
        for j in news:
            left_new[j][t] -= matched * left_new[j][t] / total_new


def _credit(old_lines: list, new_lines: list, o2n: dict, old_placed=None, new_placed=None) -> dict:
    """Edges: each old line goes to its paired new commit when that commit has it, the rest are
    shared in proportion among the new commits that add the line and have copies left: first
    those adding it to the same file (``old_placed``/``new_placed``: ``placed_lines`` counts), then
    any. A line many commits repeat (a decorator, a marker) then goes where it went in the tree."""
    left_old = [Counter(c) for c in old_lines]
    left_new = [Counter(c) for c in new_lines]
    old_placed = [Counter(c) for c in old_placed] if old_placed is not None else None
    new_placed = [Counter(c) for c in new_placed] if new_placed is not None else None
    edges = Counter()
    for i, j in o2n.items():
        for t, n in left_old[i].items():
            m = min(n, left_new[j].get(t, 0))
            if m:
                edges[(i, j)] += m
                left_old[i][t] -= m
                left_new[j][t] -= m
                if old_placed is not None:
                    paths = sorted(old_placed[i].get(t, ()))
                    _take(old_placed[i], t, m, paths[0] if paths else "")
                    _take(new_placed[j], t, m, paths[0] if paths else "")
    if old_placed is not None:  # same file first, then any
        at_old, at_new = [_at_paths(c) for c in old_placed], [_at_paths(c) for c in new_placed]
        _share(edges, at_old, at_new)
        left_old = [_by_token(c) for c in at_old]
        left_new = [_by_token(c) for c in at_new]
    _share(edges, left_old, left_new)
    return dict(edges)


def _at_paths(placed: dict) -> Counter:
    return Counter({(p, t): n for t, paths in placed.items() for p, n in paths.items() if n > 1e-12})


def _by_token(at_paths: Counter) -> Counter:
    out = Counter()
    for (_, t), n in at_paths.items():
        if n > 1e-12:
            out[t] += n
    return out


def _real(w: float, share_old: float, share_new: float) -> bool:
    best = max(share_old, share_new)
    return w > 0 and (best >= 0.5 or (w >= EDGE_MIN_LINES - 1e-9 and best >= EDGE_SHARE))


def _revert_notes(commits: list, flow: StackFlow, notes: dict, side: str) -> None:
    for m, by in flow.reverts.items():
        removed = sum(sided(commits[m])[1].values())
        n = sum(by.values())
        if removed and n >= REVERT_SHARE * removed:
            whom = ", ".join(f"#{commits[k].number}" for k in sorted(by))
            notes.setdefault(m, []).append(f"in-stack revert: takes back {n} lines {whom} added in the {side} stack")
    for m, c in enumerate(commits):  # re-adds lines an earlier commit of the stack took back
        back = Counter()
        added = sided(c)[0]
        for r in range(m):
            if r in flow.reverts:
                gone = sided(commits[r])[1]
                n = sum(min(n_add, gone[t]) for t, n_add in added.items() if t in gone)
                if n:
                    back[r] += n
        if back and sum(back.values()) >= REVERT_SHARE * max(1, sum(added.values())):
            whom = ", ".join(f"#{commits[r].number}" for r in sorted(back))
            notes.setdefault(m, []).append(f"undoes the in-stack revert {whom} of the {side} stack")


def attribute(old: list, new: list, o2n: dict, in_base=None) -> Attribution:
    """Edges between old and new commits by their added lines, for commits ``o2n`` pairs and not.
    ``in_base``: ``{old index: Counter}`` of added lines the new base already has (``inbase``):
    absorption, not evidence of where the old commit went, so they are left out first."""
    in_base = in_base or {}
    old_lines = [signed_lines(c) - in_base.get(i, Counter()) for i, c in enumerate(old)]
    new_lines = [signed_lines(c) for c in new]
    new_placed = [placed_lines(c) for c in new]
    removals = {t for c in old_lines for t in c if t[0] == "-"}  # old commits that only remove lines
    for j, c in enumerate(new):  # ... are traced by the same removals in a new commit that also adds
        extra = Counter({"-" + t: n for t, n in sided(c)[1].items() if "-" + t in removals}) \
            if any(t[0] == "+" for t in new_lines[j]) else Counter()
        if extra:
            new_lines[j] += extra
            for f in c.files:
                for line in f.signed:
                    token = "-" + line[1:].strip()
                    if line[:1] == "-" and token in extra:
                        new_placed[j].setdefault(token, Counter())[f.path] += 1
    old_placed = [placed_lines(c) for c in old]
    for i, gone in in_base.items():  # lines in the base are nobody's evidence
        for t, n in gone.items():
            _take(old_placed[i], t, n)
    edges = _credit(old_lines, new_lines, o2n, old_placed, new_placed)
    att = Attribution(edges, [sum(c.values()) for c in old_lines], [sum(c.values()) for c in new_lines], [])
    paired_new = set(o2n.values())
    for (i, j) in sorted(edges):
        if o2n.get(i) == j:
            continue
        w, share_old, share_new = att.share(i, j)
        if i in o2n and j in paired_new:  # both have partners: a regroup needs firmer evidence
            if w < CROSS_MIN_LINES - 1e-9 or min(share_old, share_new) < CROSS_SHARE:
                continue
        elif j in paired_new and share_old < PART_SHARE:  # folded into a paired commit: much of it
            continue
        elif i in o2n and share_new < PART_SHARE:  # split off a paired commit: much of the part
            continue
        if _real(w, share_old, share_new):
            att.links.append((i, j))
    flows = stack_flow(old), stack_flow(new)
    _revert_notes(old, flows[0], att.notes_old, "old")
    _revert_notes(new, flows[1], att.notes_new, "new")
    _rewritten_links(old, new, o2n, att, flows)
    return att


def _linked(att: Attribution, o2n: dict, side: str) -> dict:
    """index -> indices on the other side it is linked to (pairs and kept edges)."""
    out = {}
    for i, j in list(o2n.items()) + att.links:
        a, b = (i, j) if side == "old" else (j, i)
        out.setdefault(a, set()).add(b)
    return out


def _rewritten_links(old: list, new: list, o2n: dict, att: Attribution, flows) -> None:
    """Squash with rewrite: a commit left without links whose lines a later commit of its stack
    mostly rewrote belongs with that later commit; so does one a squashed message names."""
    for side, mine, theirs, flow in (("old", old, new, flows[0]), ("new", new, old, flows[1])):
        linked = _linked(att, o2n, side)
        for k, c in enumerate(mine):
            if k in linked or not c.tokens:
                continue
            added = sum(sided(c)[0].values())
            taken = flow.taken.get(k, Counter())
            target, why = None, ""
            for m, n in sorted(taken.items(), key=lambda kv: (-kv[1], kv[0])):
                if added and n >= REWRITTEN_SHARE * added and m in linked:
                    target = m
                    why = f"#{mine[m].number} rewrote {n} of its {added} added lines; squashed"
                    break
            others = sorted(linked[target]) if target is not None else []
            if not others and side == "old":  # folded into what its neighbour became, by its words
                for x in sorted(linked.get(k - 1, set()) | linked.get(k + 1, set())):
                    reason = names_other(theirs[x].message, c.subject) or echoes(theirs[x].message, c.subject)
                    if reason and not _undoes(c, theirs[x]):
                        others, why = [x], f"new #{theirs[x].number} {reason}; squashed with a neighbour"
                        break
            if not others:  # the squashed commit's own message may name it
                for x, d in enumerate(theirs):
                    reason = names_other(d.message, c.subject, c.message)
                    if reason and side == "old" and not _undoes(c, d):
                        others, why = [x], f"new #{d.number} {reason}; squashed"
                        break
            for x in others:
                att.links.append((k, x) if side == "old" else (x, k))
            if others:
                (att.notes_old if side == "old" else att.notes_new).setdefault(k, []).append(why)


def _undoes(c, d) -> bool:
    """``c`` does the opposite of ``d`` (adds most of what ``d`` removes, or removes most of what it
    adds): a revert and its re-apply name each other, but one cannot be squashed into the other."""
    plus, minus = sided(c)
    their_plus, their_minus = sided(d)
    for mine, theirs in ((plus, their_minus), (minus, their_plus)):
        total = sum(mine.values())
        if total and 2 * sum(min(n, theirs[t]) for t, n in mine.items() if t in theirs) >= total:
            return True
    return False


def group_edges(att: Attribution, olds: list, news: list, o2n: dict, old: list, new: list) -> list:
    """``[(old number, new number, lines, share of old, share of new)]`` of one group's edges."""
    out = []
    kept = set(att.links) | set(o2n.items())
    for i in olds:
        for j in news:
            if (i, j) in kept:
                w, so, sn = att.share(i, j)
                out.append((old[i].number, new[j].number, round(w, 1), round(so, 2), round(sn, 2)))
    return out


def describe_edges(edges: list) -> str:
    """One phrase per edge: which share of the old commit's added lines went where."""
    parts = []
    for o, n, w, so, sn in edges:
        if w:
            parts.append(f"old #{o} -> new #{n}: {w:g} lines ({so:.0%} of old #{o}, {sn:.0%} of new #{n})")
        else:
            parts.append(f"old #{o} -> new #{n}: no shared added lines (linked by the stack's history)")
    return "lines: " + ", ".join(parts) if parts else ""


def add_commit_notes(rows: list, att: Attribution, old: list, new: list) -> None:
    """Attach the per-commit notes (in-stack reverts, squash evidence) to the rows holding them."""
    for row in rows:
        for side, commits, notes in (("old", row.old, att.notes_old), ("new", row.new, att.notes_new)):
            stack = old if side == "old" else new
            for c in commits:
                k = c.number - 1
                if 0 <= k < len(stack) and stack[k] is c:
                    for note in notes.get(k, []):
                        text = f"{side} #{c.number}: {note}"
                        if text not in row.notes:
                            row.notes.append(text)
