"""A group of commits that tells two stories, cut apart at its weak links.

Attribution joins every old and new commit an edge reaches into one group. One weak edge (a few
lines, a small share of both commits) between two otherwise separate structures (a split here, a
pair there) glued them into one "merged (2 old / 4 new)" row, which no reviewer would write. A
weak edge whose removal leaves two parts that each keep an old and a new commit is cut, and
each part is reported with its own status; a weak edge inside a cycle (a regroup) or one whose
cut would strand a lone commit stays, since it is part of that structure's story.
"""

WEAK_SHARE = 0.5  # an edge carrying less than this share of both of its commits is weak


def _components(members: set, edges: set) -> list:
    nodes = {m: {m} for m in members}
    for i, j in edges:
        a, b = nodes[("o", i)], nodes[("n", j)]
        if a is not b:
            a |= b
            for m in b:
                nodes[m] = a
    out = []
    for group in nodes.values():
        if all(group is not g for g in out):
            out.append(group)
    return out


def _structure(part: set) -> bool:
    return any(side == "o" for side, _ in part) and any(side == "n" for side, _ in part)


def parts(members: list, edges, att, o2n: dict, old: list, new: list) -> list:
    """``[(members, [note])]``: ``members`` (``("o", i)`` / ``("n", j)``) cut at weak bridges, each
    part with the notes of the cuts that made it. ``edges``: ``(old index, new index)`` links."""
    mem = set(members)
    local = {(i, j) for i, j in edges if ("o", i) in mem and ("n", j) in mem}
    if len(mem) <= 2:
        return [(members, [])]
    weak = []
    for i, j in local:
        w, share_old, share_new = att.share(i, j)
        if o2n.get(i) != j and max(share_old, share_new) < WEAK_SHARE:
            weak.append((w, i, j, share_old, share_new))
    for w, i, j, share_old, share_new in sorted(weak):
        rest = local - {(i, j)}
        split = _components(mem, rest)
        if len(split) > 1 and all(_structure(p) for p in split):
            note = (f"weak link old #{old[i].number} -> new #{new[j].number} ({w:g} lines, {share_old:.0%} of "
                    f"old #{old[i].number}, {share_new:.0%} of new #{new[j].number}) left out: a separate story")
            out = []
            for p in split:
                for sub, notes in parts(sorted(p), rest, att, o2n, old, new):
                    out.append((sub, [note] + notes))
            return out
    return [(members, [])]
