"""Several old commits in new ones: a squash (``merged``) or a reorganization (``regrouped``).

Attribution finds that the added lines of several old commits reappear in one new commit; it
cannot say why. A reviewer tells two stories apart:

- **merged** (a squash): the old commits were one change told in several commits, and the new
  stack tells it in one. Evidence, any of: they were neighbours in the old stack (no commit the
  new stack carries elsewhere sat between them), they share a topic word in their subjects, a
  later one rewrote an earlier one's lines, or the new commit's message names each of them (quotes
  its subject, names its pull request, describes it in its words) besides the one whose subject it
  took.
- **regrouped**: unrelated commits put together: not neighbours, no shared topic, no rewrite, and
  a message of its own. Several old commits spread over several new ones (lines moved across) are
  a regroup too: no single commit of either side tells the story.
"""

from tools.rebase.analysis.subjects import echoes, names_other, normalized, strip_numbering, words

_GENERIC = frozenset("fix fixes fixed feat feature features add adds added support supports update use "
                     "make allow enable new misc minor chore refactor patch megatron core wip more "
                     "also again one two".split())


def topic(subject: str) -> set:
    """The words that say what a subject is about (no numbering, stop or generic words, no PR numbers)."""
    return {w for w in words(strip_numbering(subject)) if len(w) >= 3 and not w.isdigit()} - _GENERIC


def _neighbours(olds: list, elsewhere: set) -> bool:
    """No old commit carried by another new commit sits between the first and last of ``olds``."""
    return not any(k not in olds and k in elsewhere for k in range(min(olds), max(olds) + 1))


def _one_topic(commits: list) -> bool:
    """Every commit shares a topic word with another one of the group."""
    topics = [topic(c.subject) for c in commits]
    return all(any(t & u for k, u in enumerate(topics) if k != m) for m, t in enumerate(topics))


def _named_by(message: str, subject: str, commits: list) -> bool:
    """The new message accounts for each old commit: the one whose subject it took, the others by
    their subject, their pull request or their words."""
    own = normalized(subject)
    for c in commits:
        if normalized(c.subject) == own:
            continue
        if not (names_other(message, c.subject, c.message) or echoes(message, c.subject)):
            return False
    return True


def status(olds: list, news: list, old: list, new: list, elsewhere: set, squashed: set) -> tuple:
    """``(status, note)`` of a group of old indices ``olds`` and new indices ``news`` (several of
    one side at least). ``elsewhere``: old indices some other new commit carries; ``squashed``: old
    indices the attribution linked by an in-stack rewrite or by a squashed message."""
    if len(news) > 1 and len(olds) > 1:
        return "regrouped", "regrouped: several old patches became several new ones"
    if len(news) > 1:
        return "split", f"split into {len(news)} patches"
    commits = [old[i] for i in olds]
    target = new[news[0]]
    if (_neighbours(olds, elsewhere) or _one_topic(commits) or squashed & set(olds)
            or _named_by(target.message, target.subject, commits)):
        return "merged", f"{len(olds)} old patches folded into one"
    numbers = ", ".join(f"#{c.number}" for c in commits)
    return "regrouped", (f"regrouped: old {numbers} (not neighbours, no common topic) now in new "
                         f"#{target.number}, whose message does not name them")
