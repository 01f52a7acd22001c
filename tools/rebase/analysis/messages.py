"""Commit messages compared as a reviewer reads them: the words, not the sign-offs.

A cherry-pick or a re-export often adds or drops attribution trailers (``Signed-off-by:``,
``Co-authored-by:``, ``Reviewed-by:``, ``(cherry picked from commit ...)``) and renumbers the
series counter while the change and its description stay the same; a reviewer calls that patch
identical. The fork's own trailers (``Patch-Name``, ``Upstream-Status``, ``Tests``, ``Drop-When``)
say what the patch is and which tests guard it, so a change to them stays a message change.
"""

import re
from collections import Counter

from tools.rebase.analysis.subjects import strip_numbering

TOOL_KEYS = frozenset(("patch-name", "upstream-status", "tests", "drop-when"))
_TRAILER = re.compile(r"^(?P<key>[A-Za-z][A-Za-z0-9-]*)\s*:\s*(?P<value>\S.*)$")
_PICKED = re.compile(r"^\(cherry picked from commit [0-9a-f]{7,64}\)$")
SHOWN = 4  # trailer changes named in a note


def _trailer_block(paragraph: str):
    """``[(key, value)]`` when every line of ``paragraph`` is a trailer (folded lines joined),
    else None."""
    out = []
    for line in paragraph.splitlines():
        m = _TRAILER.match(line.strip()) if not line[:1].isspace() else None
        if m:
            out.append((m["key"], m["value"].strip()))
        elif _PICKED.match(line.strip()):
            out.append(("cherry-picked-from", line.strip()[len("(cherry picked from commit "):-1]))
        elif line[:1].isspace() and out:
            out[-1] = (out[-1][0], f"{out[-1][1]} {line.strip()}")
        else:
            return None
    return out


def split(message: str) -> tuple:
    """``(core, trailers)``: the message without its series counter and without the attribution
    trailers of its closing paragraphs, and those trailers as ``[(key, value)]`` in order. The
    fork's own trailers stay in the core."""
    paragraphs = [p.strip("\n") for p in re.split(r"\n[ \t]*\n", message.strip()) if p.strip()]
    trailers = []
    while len(paragraphs) > 1:
        block = _trailer_block(paragraphs[-1])
        if block is None:
            break
        paragraphs.pop()
        kept = [f"{k}: {v}" for k, v in block if k.lower() in TOOL_KEYS]
        trailers = [(k, v) for k, v in block if k.lower() not in TOOL_KEYS] + trailers
        if kept:  # the fork's trailers are part of what the patch says
            paragraphs.append("\n".join(kept))
            break
    lines = "\n\n".join(paragraphs).splitlines()
    if lines:
        lines[0] = strip_numbering(lines[0])
    return "\n".join(line.rstrip() for line in lines), trailers


def core(message: str) -> str:
    """What the message says: no series counter, no attribution trailers."""
    return split(message)[0]


def trailer_change(old_message: str, new_message: str) -> str:
    """``"trailers changed: +Co-authored-by: X; -Signed-off-by: Y"`` or "" when they agree."""
    old = Counter((k.lower(), v) for k, v in split(old_message)[1])
    new = Counter((k.lower(), v) for k, v in split(new_message)[1])
    if old == new:
        return ""
    names = {k.lower(): k for k, _ in split(old_message)[1] + split(new_message)[1]}
    parts = [f"+{names[k]}: {v}" for (k, v) in sorted((new - old).elements())]
    parts += [f"-{names[k]}: {v}" for (k, v) in sorted((old - new).elements())]
    more = f" and {len(parts) - SHOWN} more" if len(parts) > SHOWN else ""
    return "trailers changed: " + "; ".join(parts[:SHOWN]) + more
