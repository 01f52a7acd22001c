"""Several old commits in new ones: a squash (``merged``) or a reorganization (``regrouped``).

Attribution finds that the added lines of several old commits reappear in one new commit; it
cannot say why. A reviewer tells two stories apart:

- **merged** (a squash): the old commits were one change told in several commits, and the new
  stack tells it in one. Two old commits are one change when any of these links them: they were
  neighbours in the old stack (no commit the new stack carries elsewhere sat between them), they
  share a topic word in their subjects, one rewrote the other's lines (the attribution's squash
  evidence), or the new commit's message names one (quotes its subject, names its pull request,
  describes it in its words) and took its subject from the other. A group is a squash when these
  links join all of its old commits.
- **regrouped**: anything else: unrelated commits (or a squash and an unrelated commit) put
  together. Several old commits spread over several new ones (lines moved across) are a regroup
  too: no single commit of either side tells the story.
"""

import re

from tools.rebase.analysis.subjects import echoes, names_other, normalized, strip_numbering, words

_GENERIC = frozenset("fix fixes fixed feat feature features add adds added support supports update use "
                     "make allow enable new misc minor chore refactor patch megatron core wip more "
                     "also again one two dev main release revert reapply cherry pick picked bump".split())
_REFS = re.compile(r"[\w.-]+/[\w.-]+!\d+|!\d+|#\d+|\(\d+\)")  # merge-request and PR references
_REWROTE = re.compile(r"#(\d+) rewrote ")


def topic(subject: str) -> set:
    """The words that say what a subject is about (no numbering, references, stop or generic words)."""
    text = _REFS.sub(" ", strip_numbering(subject))
    return {w for w in words(text) if len(w) >= 3 and not w.isdigit()} - _GENERIC


def _links(olds: list, old: list, target, elsewhere: set, squashed: dict) -> list:
    """``(a, b)`` pairs of ``olds`` that one of the squash links joins."""
    out = []
    for a, b in zip(olds, olds[1:]):  # neighbours
        if not any(k in elsewhere for k in range(a + 1, b)):
            out.append((a, b))
    topics = {i: topic(old[i].subject) for i in olds}
    out += [(a, b) for a in olds for b in olds if a < b and topics[a] & topics[b]]
    by_number = {old[i].number: i for i in olds}
    for k, notes in squashed.items():  # rewritten by #m, or squashed with its neighbour
        if k not in olds:
            continue
        named = [by_number[int(m)] for note in notes for m in _REWROTE.findall(note) if int(m) in by_number]
        nearest = min((i for i in olds if i != k), key=lambda i: (abs(i - k), i), default=k)
        out += [(k, m) for m in named] or [(k, nearest)]
    own = [i for i in olds if normalized(old[i].subject) == normalized(target.subject)]
    for i in olds:  # the message names it, the subject is another's
        if i not in own and (names_other(target.message, old[i].subject, old[i].message)
                             or echoes(target.message, old[i].subject)):
            out += [(i, j) for j in own] or [(i, j) for j in olds if j != i]
    return out


def _joined(olds: list, links: list) -> bool:
    parent = {i: i for i in olds}

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in links:
        parent[find(a)] = find(b)
    return len({find(i) for i in olds}) == 1


def status(olds: list, news: list, old: list, new: list, elsewhere: set, squashed: dict) -> tuple:
    """``(status, note)`` of a group of old indices ``olds`` and new indices ``news`` (several of
    one side at least). ``elsewhere``: old indices some other new commit carries; ``squashed``:
    ``{old index: [note]}`` of the attribution's squash evidence (an in-stack rewrite, a message)."""
    if len(news) > 1 and len(olds) > 1:
        return "regrouped", "regrouped: several old patches became several new ones"
    if len(news) > 1:
        return "split", f"split into {len(news)} patches"
    target = new[news[0]]
    if _joined(olds, _links(olds, old, target, elsewhere, squashed)):
        return "merged", f"{len(olds)} old patches folded into one"
    numbers = ", ".join(f"#{old[i].number}" for i in olds)
    return "regrouped", (f"regrouped: old {numbers} now in new #{target.number}, not one change (not all "
                         f"neighbours, of one topic, rewritten by each other or named by its message)")
