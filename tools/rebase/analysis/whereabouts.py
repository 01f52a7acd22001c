"""Where an old patch nobody in the new stack claims went: absorbed, likely absorbed, or dropped.

History is searched first (the upstream commit holding its lines in the stack's files, the commit
it was cherry-picked from, its text or its new names anywhere in the range, a re-implementation in
the same function); what the new base holds has the last word (``carried``): history that found a
commit whose change the new base carries is an absorption by that commit, and history that only
touched the patch's code, with none of its change in the new base, is no absorption at all.
"""

import os
import tempfile

from tools.rebase.analysis import carried, reimplemented, upstream_search
from tools.rebase.analysis.diffparse import find_absorbing_commit
from tools.rebase.git.gitcmd import git, git_proc


def reverse_applies(repo, tree_commit: str, diff: str) -> bool:
    """True when ``diff`` is already contained in ``tree_commit`` (its reverse applies cleanly)."""
    if not diff.strip():
        return False
    with tempfile.TemporaryDirectory() as tmp:
        index = os.path.join(tmp, "index")
        env = {"GIT_INDEX_FILE": index}
        git("read-tree", tree_commit, cwd=repo, env=env)
        proc = git_proc("apply", "--cached", "--check", "-R", "-", cwd=repo, env=env,
                        input=diff + "\n")
        return proc.returncode == 0


def search(repo, candidates: dict, upstream: list, upstream_range, lines, bases: tuple, in_base: dict) -> tuple:
    """``(absorbed, likely, not_carried)`` for ``candidates`` (``{old index: Commit}``):
    ``{index: (upstream commit or "", how)}``, ``{index: (commit, subject, how)}`` and ``{index:
    note}`` of those history pointed at but the new base does not carry. ``lines``: the
    ``fingerprints.UpstreamLines`` of ``upstream``; ``bases``: ``(old base, new base, new tip)``."""
    old_base, new_base, new_tip = bases
    absorbed, likely, not_carried = {}, {}, {}
    if not candidates:
        return absorbed, likely, not_carried
    scan = upstream_search.start(repo, upstream_range, list(candidates.values())) if upstream_range else None
    held = carried.measure(repo, old_base, new_base, candidates, in_base) if old_base != new_base else {}
    verdict = {i: held[i].verdict if held else "touched" for i in candidates}
    unfound = []
    for i, c in candidates.items():  # in the stack's files, or the commit it was picked from
        commit, how = find_absorbing_commit(repo, c, lines.live(c))
        picked = carried.picked_from(c, upstream)
        if commit and verdict[i] != "absent":
            absorbed[i] = (commit, how)
        elif picked and verdict[i] != "absent":
            absorbed[i] = (picked, "cherry-picked from it" + (f"; {held[i].describe()}" if held else ""))
        else:
            unfound.append(i)
    anywhere = upstream_search.search(repo, scan, [candidates[i] for i in unfound], old_base) if scan else {}
    for i in unfound:  # its text in files the stacks never touched, or a re-implementation
        c = candidates[i]
        kind, commit, subject, how = anywhere.get(c.commit, ("", "", "", ""))
        if kind == "absorbed" and verdict[i] != "absent":  # a line repeated elsewhere is no move
            absorbed[i] = (commit, how)
        elif reverse_applies(repo, new_base, c.diff) and reverse_applies(repo, new_tip, c.diff):
            # in the new base, and no commit of the new stack undoes it (a re-apply of a revert)
            absorbed[i] = ("", "its change is already in the new base")
        elif kind == "likely":
            likely[i] = (commit, subject, how)
        elif upstream_range:  # a re-implementation in the files it changed, by function and purpose
            found = reimplemented.find(c, upstream)
            if found:
                likely[i] = found
    for i, (commit, subject, how) in list(likely.items()):  # what history found, against the new base
        if verdict[i] == "absent":
            del likely[i]
            not_carried[i] = (f"not in the new stack; upstream {commit[:12]} ({subject}) touched the same code "
                              f"({how}), but the new base does not carry its change: {held[i].describe()}")
        elif verdict[i] == "carried":
            del likely[i]
            absorbed[i] = (commit, f"{held[i].describe()}; upstream's text differs")
    return absorbed, likely, not_carried
