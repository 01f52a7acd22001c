"""Which added lines of the old stack the new base already has: evidence of absorption, first.

A line an old patch added that the new base gained over the old base (same file, same text,
whitespace aside) is upstream's now. Such lines can tell nothing about which new patch carries the
old one, since the new stack no longer adds them; counted as pairing evidence they glued an absorbed
patch to whatever new patch held its small remainder. They are taken out before pairing and
attribution, and a patch mostly made of them is absorbed (partly, when the rest went elsewhere).
"""

from collections import Counter

from tools.rebase.analysis.attribution import signed_lines
from tools.rebase.analysis.lint import read_blobs

ABSORBED_SHARE = 0.5  # share of a commit's added lines in the new base that makes it absorbed


def _stripped_counts(text) -> Counter:
    return Counter(line.strip() for line in (text or "").splitlines() if line.strip())


def _added(commits: list) -> dict:
    """``{path: Counter}``: copies of each stripped line a stack's commits add to a file (a later
    commit taking one back does not cancel that one commit added it)."""
    out = {}
    for c in commits:
        for f in c.files:
            counts = out.setdefault(f.path, Counter())
            for line in f.signed:
                if line[:1] == "+" and line[1:].strip():
                    counts[line[1:].strip()] += 1
    return out


def lines_in_base(repo, old_base: str, new_base: str, commits: list, new_commits=()) -> dict:
    """``{index: Counter of "+text" tokens}``: per old commit, its added lines (as
    ``attribution.signed_lines`` counts them) that the new base gained in the same file.

    A copy the new stack still adds itself is the fork's, not upstream's: a line many places
    repeat (a decorator, a marker) that upstream added elsewhere in the same file says nothing
    about a patch the new stack still carries. Only the copies the old stack added and the new
    stack no longer adds (``new_commits``) can be in the base for it."""
    if old_base == new_base or not commits:
        return {}
    paths = sorted({f.path for c in commits for f in c.files})
    specs = [f"{rev}:{p}" for p in paths for rev in (old_base, new_base)]
    blobs = read_blobs(repo, specs)
    old_added, new_added = _added(commits), _added(new_commits)
    gained = {}
    for p in paths:
        before, after = _stripped_counts(blobs[f"{old_base}:{p}"]), _stripped_counts(blobs[f"{new_base}:{p}"])
        more = after - before
        if new_commits:  # at most what the fork stopped adding itself
            dropped_by_fork = old_added.get(p, Counter()) - new_added.get(p, Counter())
            more = Counter({t: min(n, dropped_by_fork[t]) for t, n in more.items() if dropped_by_fork[t] > 0})
        if more:
            gained[p] = more
    if not gained:
        return {}
    out = {}
    for i, c in enumerate(commits):
        wanted = signed_lines(c)
        found = Counter()
        for f in c.files:
            left = gained.get(f.path)
            if not left:
                continue
            for line in f.signed:
                token = "+" + line[1:].strip()
                if line[:1] == "+" and wanted.get(token, 0) > found[token] and left.get(token[1:], 0) > 0:
                    found[token] += 1
                    left[token[1:]] -= 1  # one gained line accounts for one added line
        if found:
            out[i] = found
    return out


def mostly_in_base(commits: list, in_base: dict) -> dict:
    """``{index: (lines in the base, added lines)}`` of the commits ``ABSORBED_SHARE`` absorbed."""
    out = {}
    for i, found in in_base.items():
        total = sum(signed_lines(commits[i]).values())
        n = sum(found.values())
        if total and n >= ABSORBED_SHARE * total:
            out[i] = (n, total)
    return out


def absorbed_row(row_type, i: int, found: tuple, old: list, new: list, att, in_base: dict):
    """The row of absorbed old commit ``i``: ``found`` is ``(upstream commit or "", how)``. When only
    part of it is in the new base, say where the rest went (the new commits its remaining lines'
    attribution edges reach), or that no new commit has it."""
    commit, how = found
    total = sum(signed_lines(old[i]).values())
    n = sum(in_base.get(i, Counter()).values())
    # partial only when the new base's lines made it absorbed (another signal found it whole)
    partial = ABSORBED_SHARE * total <= n < total and how != "same patch-id"
    word = "partially absorbed upstream" if partial else "absorbed upstream"
    where = f" in {commit[:12]}" if commit else ""
    row = row_type("absorbed", [old[i]], [], upstream=commit or "", partial=partial)
    row.notes.append(word + where + (f" ({how})" if how else ""))
    if partial:
        rest = total - n
        reach = sorted(((j, w) for (k, j), w in att.edges.items() if k == i and w > 0), key=lambda e: (-e[1], e[0]))
        if reach:
            row.folded = [new[j] for j, _ in sorted(reach)]
            held = sum(w for _, w in reach)
            places = ", ".join(f"new #{new[j].number} ({new[j].subject})" for j, _ in reach)
            amount = f"the other {rest}" if held >= rest - 1e-9 else f"{held:g} of the other {rest}"
            row.notes.append(f"{amount} added lines folded into {places}")
        else:
            row.notes.append(f"the other {rest} added lines are in no new patch")
    return row


def note_holders(rows: list) -> None:
    """On the row of each new commit that holds an absorbed commit's rest, say so."""
    holders = {}
    for row in rows:
        for c in row.folded:
            holders.setdefault(c.commit, []).append(row.old[0])
    for row in rows:
        for c in row.new:
            for o in holders.get(c.commit, []):
                note = f"new #{c.number} also holds the rest of old #{o.number} ({o.subject}), partially absorbed upstream"
                if note not in row.notes:
                    row.notes.append(note)
