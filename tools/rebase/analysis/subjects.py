"""Subjects without their numbering, and the evidence a message gives about other commits.

A series counter (``[3/8] ``, ``[PATCH v2 3/8] ``, ``PATCH 3/8: ``) or a file-name number
(``0003-``) says where a patch sat, not what it does: two versions of one patch whose counters
differ must still match by subject. A squashed commit often names its parts in its own message
(their subjects, or their pull-request numbers), which is evidence for a merge.
"""

import re

_PREFIXES = (
    re.compile(r"^\s*\[[^\]]*?\b\d+\s*/\s*\d+\]\s*"),  # [3/8], [PATCH v2 3/8], [fix 1/2]
    re.compile(r"^\s*\(\s*\d+\s*/\s*\d+\s*\)\s*"),  # (3/8)
    re.compile(r"^\s*PATCH\s+(?:v\d+\s+)?\d+\s*/\s*\d+\s*:?\s*", re.I),  # PATCH 3/8:
    re.compile(r"^\s*\d{1,4}\s*/\s*\d{1,4}\s*[:.)-]\s*"),  # 3/8: subject
    re.compile(r"^\s*\d{4}-(?=[A-Za-z])"),  # 0003-subject (a patch file's number)
    re.compile(r"^\s*#?\d{1,3}[.):]\s+"),  # 3. subject, 3) subject
)
_PR = re.compile(r"(?:(?<![\w/])#|\bPR\s*#?|/pull/)(\d{2,7})\b", re.I)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]+")
_STOP = frozenset("a an and the of to for in on with by from into at is are be as or not".split())


def strip_numbering(subject: str) -> str:
    """``subject`` without leading series counters or patch numbers (applied until none is left)."""
    text = subject
    changed = True
    while changed:
        changed = False
        for pattern in _PREFIXES:
            stripped = pattern.sub("", text, count=1)
            if stripped != text and stripped.strip():
                text, changed = stripped, True
    return text.strip()


def normalized(subject: str) -> str:
    """The comparable form of a subject: no numbering, case and spacing folded."""
    return " ".join(strip_numbering(subject).lower().split())


def pr_numbers(message: str) -> set:
    """Pull-request numbers a message names (``#123``, ``PR 123``, ``.../pull/123``)."""
    return set(_PR.findall(message))


def words(text: str) -> set:
    """Lower-case content words of ``text`` (stop words and one-letter words left out)."""
    return {w.lower() for w in _WORD.findall(text) if w.lower() not in _STOP}


def names_other(message: str, other_subject: str, other_message: str = "") -> str:
    """Why ``message`` (a squashed commit's) names the other commit, or "" when it does not:
    the other's subject (numbering stripped) inside it, or a pull-request number they share."""
    core = normalized(other_subject)
    if len(core) >= 8 and core in " ".join(message.lower().split()):
        return f"its message quotes the subject {strip_numbering(other_subject)!r}"
    shared = pr_numbers(other_subject) & pr_numbers(message)
    if shared:
        return f"its message names PR #{min(shared, key=int)}"
    return ""


_GENERIC = frozenset("fix fixes feat feature add adds added support supports update use make allow "
                     "enable new misc minor chore refactor patch megatron core".split())


def echoes(message: str, subject: str) -> str:
    """Why ``message`` describes the change ``subject`` names (two thirds of its own words, at
    least two, appear in it), or "": weaker than ``names_other``, for a neighbour's squash."""
    own = {w for w in words(strip_numbering(subject)) if len(w) >= 3} - _GENERIC
    if len(own) < 2:
        return ""
    found = own & words(message)
    if len(found) * 3 >= len(own) * 2 and len(found) >= 2:
        return f"its message describes it ({', '.join(sorted(found))})"
    return ""
