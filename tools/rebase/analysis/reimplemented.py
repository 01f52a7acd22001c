"""A vanished patch whose need upstream met in its own code: same function or field, other text.

The whole-range scan (``upstream_search``) finds a patch's text anywhere, or the names it
introduced. A patch that changed an existing function (a clamp, a normalization, a default) leaves
no new name behind, and upstream's fix of the same problem shares no line with it. What remains is
where the change was made and why: an upstream commit that changes the same file inside the same
function or class (the diff's hunk headers, the defs among its lines), or the same distinctive
names (config fields, arguments), and whose subject names the same purpose.
"""

import re

from tools.rebase.analysis.subjects import pr_numbers, strip_numbering, words

_HUNK_HEAD = re.compile(r"^@@ [^@]* @@\s?(?P<ctx>.*)$")
_DEF = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)")
_IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
_GENERIC = frozenset("fix fixes fixed feat add adds added support update use make allow enable new misc minor "
                     "chore refactor patch megatron core dev main cherry pick picked into when for".split())


def _distinctive(name: str) -> bool:
    return len(name) >= 6 and ("_" in name.strip("_") or (name[0].isupper() and any(c.islower() for c in name)
                                                            and any(c.isupper() for c in name[1:])))


def _per_file(diff: str) -> dict:
    """``{path: (enclosing defs, distinctive names of changed lines)}`` of a git diff."""
    out, path, in_hunk, current = {}, None, False, ""
    for line in diff.split("\n"):
        if line.startswith("diff --git "):
            path, in_hunk = None, False
        elif line.startswith(("--- a/", "+++ b/")) and not in_hunk:
            path = line[6:]
            out.setdefault(path, (set(), set()))
        elif path is not None and line.startswith("@@"):
            in_hunk = True
            m = _HUNK_HEAD.match(line)
            name = _DEF.match(m["ctx"]) if m else None
            current = name[1] if name else ""  # the def the next change sits in
        elif path is not None and line[:1] == " ":
            name = _DEF.match(line[1:])
            current = name[1] if name else current
        elif path is not None and line[:1] in "+-":
            defs, names = out.setdefault(path, (set(), set()))
            name = _DEF.match(line[1:])
            defs.update(n for n in (current, name[1] if name else "") if n)
            names.update(n for n in _IDENT.findall(line[1:]) if _distinctive(n))
    return out


_PARSED = {}  # upstream commit -> _per_file of its diff (commits are immutable)


def _purpose(subject: str) -> set:
    return {w for w in words(strip_numbering(subject)) if len(w) >= 3} - _GENERIC


def find(patch, upstream: list):
    """``(upstream commit, subject, how)`` of the upstream commit most likely re-implementing
    ``patch`` in the files it changed, or None."""
    mine = _per_file(patch.diff)
    purpose = _purpose(patch.subject)
    prs = pr_numbers(patch.subject)
    best = None
    for k, u in enumerate(upstream):
        if not {f.path for f in u.files} & set(mine):
            continue
        theirs = _PARSED.get(u.commit)
        if theirs is None:
            theirs = _PARSED.setdefault(u.commit, _per_file(u.diff))
        for path, (defs, names) in mine.items():
            if path not in theirs:
                continue
            same_defs = defs & theirs[path][0]
            same_names = (names & theirs[path][1]) - same_defs
            title = purpose & _purpose(u.subject)
            same_pr = prs & pr_numbers(u.message)
            if not (same_pr or (same_defs and (title or len(same_names) >= 2))
                    or (len(same_names) >= 2 and title)):
                continue
            score = (bool(same_pr), len(same_defs) + len(same_names) + len(title), k)
            if best is None or score > best[0]:
                best = (score, u, path, same_defs, same_names, title, same_pr)
    if best is None:
        return None
    _, u, path, same_defs, same_names, title, same_pr = best
    parts = []
    if same_pr:
        parts.append(f"it names the same PR #{min(same_pr, key=int)}")
    if same_defs:
        parts.append(f"changes {', '.join(f'`{d}`' for d in sorted(same_defs))} in `{path}` too")
    if same_names:
        shown = sorted(same_names, key=lambda n: (-len(n), n))[:4]
        parts.append(f"touches the same names {', '.join(f'`{n}`' for n in shown)} in `{path}`")
    if title:
        parts.append(f"its subject shares {', '.join(sorted(title))}")
    return u.commit, u.subject, "other text, but " + "; ".join(parts)


def not_found(patch, upstream: list) -> str:
    """The dropped row's note: what was searched, so a reader knows the search came up empty."""
    files = sorted({f.path for f in patch.files})
    touching = sum(1 for u in upstream if {f.path for f in u.files} & set(files))
    shown = ", ".join(f"`{p}`" for p in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    return (f"not in the new stack; no upstream change found (searched the whole upstream range for its lines "
            f"and new names, and the {touching} upstream commits touching {shown or 'its files'} for its "
            f"functions, names and subject)")
