"""A reason for every adaptation: which upstream change made a patch's hunk move or change.

A reviewer explains a modified or refreshed patch by the upstream commit that changed the code
around it ("upstream X removed helper Y", "moved the file to Z"). Here each hunk of the old patch
is placed in the old base (undoing the earlier patches of the stack on that file), followed
through every upstream change between the bases (commit by commit when history is there, else the
bases' own diff), and the changes that touch its lines, or shift them, are named with what they did.
"""

import re
from dataclasses import dataclass, field

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_DEF = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)")
_IDENT = re.compile(r"[A-Za-z_]\w*")
MARGIN = 3  # lines around a hunk that still count as its surroundings
MAX_REASONS = 6  # per row


@dataclass
class Block:
    """One run of removed then added lines: old lines [old, old + len(removed)) became ``added``,
    starting at line ``new`` of the result."""
    old: int
    new: int
    removed: list = field(default_factory=list)
    added: list = field(default_factory=list)


@dataclass
class FileChange:
    old_path: str
    path: str
    blocks: list = field(default_factory=list)
    hunks: list = field(default_factory=list)  # [(old start, old count, new start, new count, lines)]
    deleted: bool = False
    created: bool = False


def parse_changes(diff: str) -> list:
    """The file changes of a unified git diff, with line-numbered blocks and hunks."""
    files, cur, block, hunk = [], None, None, None
    old_no = new_no = 0
    for line in diff.split("\n"):
        if line.startswith("diff --git "):
            m = re.match(r'^diff --git "?a/(.*?)"? "?b/(.*?)"?$', line)
            cur = FileChange(*(m.groups() if m else (line, line)))
            files.append(cur)
            block = hunk = None
            continue
        if cur is None:
            continue
        m = _HUNK.match(line)
        if m:
            old_no, new_no = int(m[1]), int(m[3])
            if m[2] == "0":
                old_no += 1  # an insertion after line N: it sits before line N + 1
            if m[4] == "0":
                new_no += 1
            hunk = (int(m[1]), int(m[2] or 1), int(m[3]), int(m[4] or 1), [])
            cur.hunks.append(hunk)
            block = None
            continue
        if hunk is None:
            if line.startswith("deleted file mode"):
                cur.deleted = True
            elif line.startswith("new file mode"):
                cur.created = True
            continue
        if line.startswith("\\"):
            continue
        hunk[4].append(line)
        if line.startswith("-"):
            if block is None or block.added:
                block = Block(old_no, new_no)
                cur.blocks.append(block)
            block.removed.append(line[1:])
            old_no += 1
        elif line.startswith("+"):
            if block is None:
                block = Block(old_no, new_no)
                cur.blocks.append(block)
            block.added.append(line[1:])
            new_no += 1
        else:
            block = None
            old_no += 1
            new_no += 1
    return files


def _back(pos: int, blocks: list) -> int:
    """A line number after ``blocks`` mapped to before them (added lines map to where they went in)."""
    shift = 0
    for b in blocks:
        if pos >= b.new + len(b.added):
            shift += len(b.added) - len(b.removed)
        elif pos >= b.new:
            return b.old
    return pos - shift


def _forward(pos: int, blocks: list) -> int:
    shift = 0
    for b in blocks:
        if pos >= b.old + len(b.removed):
            shift += len(b.added) - len(b.removed)
        elif pos >= b.old:
            return b.new
    return pos + shift


def _name(text: str) -> str:
    m = _DEF.match(text)
    return m[1] if m else ""


def describe(blocks: list, path: str, shifted: int = 0) -> str:
    """What upstream did in these blocks, as a reviewer would put it."""
    removed = [t for b in blocks for t in b.removed]
    added = [t for b in blocks for t in b.added]
    gone = {_name(t) for t in removed} - {_name(t) for t in added} - {""}
    new = {_name(t) for t in added} - {_name(t) for t in removed} - {""}
    both = {_name(t) for t in removed} & {_name(t) for t in added} - {""}
    parts = []
    if gone:
        parts.append("removed " + ", ".join(f"`{n}`" for n in sorted(gone)))
    if new:
        parts.append("added " + ", ".join(f"`{n}`" for n in sorted(new)))
    for n in sorted(both):
        before = [t.strip() for t in removed if _name(t) == n]
        after = [t.strip() for t in added if _name(t) == n]
        if before != after:
            parts.append(f"changed the signature of `{n}`")
    for b in blocks:
        if len(b.removed) == len(b.added):
            for x, y in zip(b.removed, b.added):
                a, c = _IDENT.findall(x), _IDENT.findall(y)
                diff = [(p, q) for p, q in zip(a, c) if p != q]
                if len(a) == len(c) and len(diff) == 1 and not _name(x):
                    parts.append(f"renamed `{diff[0][0]}` to `{diff[0][1]}`")
    if not parts:
        first = next((t.strip() for t in removed + added if t.strip()), "")
        if not removed:
            what = f"added {len(added)} line{'s' if len(added) > 1 else ''}"
        elif not added:
            what = f"removed {len(removed)} line{'s' if len(removed) > 1 else ''}"
        else:
            what = f"changed +{len(added)}/-{len(removed)} lines"
        parts.append(what + (f" (`{first[:60]}`)" if first else ""))
    text = "; ".join(dict.fromkeys(parts))
    where = f" above the hunk (shifting it {shifted:+d} lines)" if shifted else " around the hunk"
    return f"{text} in `{path}`{where}"


def _changes_of(commit) -> list:
    """``parse_changes`` of a stack commit's diff, parsed once (kept on the commit object)."""
    cached = commit.__dict__.get("_file_changes")
    if cached is None:
        cached = commit.__dict__["_file_changes"] = parse_changes(commit.diff)
    return cached


def _place(old_stack: list, patch, path: str, start: int, end: int):
    """The hunk's line range in the old base: earlier patches of the stack on ``path`` undone."""
    for c in reversed(old_stack[: patch.number - 1]):
        if not any(f.path == path for f in c.files):
            continue
        for fc in _changes_of(c):
            if fc.path == path:
                start, end = _back(start, fc.blocks), _back(end, fc.blocks)
                path = fc.old_path
    return path, start, end


def _changed_hunks(old, new) -> list:
    """``[(path, old-side start, end, kind)]`` for the old patch's hunks the new patch does not
    carry unchanged: kind "changed" (other +/- lines), "context" or "moved" (offsets only)."""
    new_hunks = {}
    for fc in _changes_of(new):
        for h in fc.hunks:
            new_hunks.setdefault(fc.path, []).append(h)
    out = []
    for fc in _changes_of(old):
        for h in fc.hunks:
            signed = [l for l in h[4] if l[:1] in "+-"]
            same = [g for g in new_hunks.get(fc.path, []) if [l for l in g[4] if l[:1] in "+-"] == signed]
            if not same:
                kind = "changed"
            elif any(g[4] == h[4] for g in same):
                if any(g[0] == h[0] for g in same):
                    continue
                kind = "moved"
            else:
                kind = "context"
            out.append((fc.path, h[0], h[0] + max(h[1], 1) - 1, kind))
    return out


def parse_steps(steps: list, paths) -> list:
    """``[(label, subject, diff text)]`` -> ``[(label, subject, [FileChange])]``, parsed once for
    all rows, keeping only the steps that change one of ``paths``."""
    wanted = set(paths)
    out = []
    for label, subject, diff in steps:
        changes = [fc for fc in parse_changes(diff) if fc.old_path in wanted or fc.path in wanted]
        if changes:
            out.append((label, subject, changes))
    return out


def _new_only_hunks(old, new) -> list:
    """``[(path, start, end)]`` of the new patch's hunks whose +/- lines the old patch lacks."""
    def signed(hunk):
        return tuple(line for line in hunk[4] if line[:1] in "+-")
    old_signed = {(fc.path, signed(h)) for fc in _changes_of(old) for h in fc.hunks}
    return [(fc.path, h[0], h[0] + max(h[1], 1) - 1) for fc in _changes_of(new) for h in fc.hunks
            if (fc.path, signed(h)) not in old_signed]


def _backward_causes(parsed: list, path: str, start: int, end: int) -> list:
    """The upstream changes (newest first) that produced lines around ``start..end`` of the new base."""
    lo, hi = start - MARGIN, end + MARGIN
    found = []
    for label, subject, changes in reversed(parsed):
        fc = next((f for f in changes if f.path == path), None)
        if fc is None:
            continue
        near = [b for b in fc.blocks if b.added and b.new <= hi and b.new + len(b.added) - 1 >= lo]
        if near:
            found.append((label, subject, describe(near, path)))
        if fc.old_path != fc.path:
            found.append((label, subject, f"moved `{fc.old_path}` to `{fc.path}`"))
        lo, hi = _back(lo, fc.blocks), _back(hi, fc.blocks)
        path = fc.old_path
    return found


def reasons(old, new, old_stack: list, parsed: list, new_stack=()) -> list:
    """``["upstream <commit> (<subject>) <what changed>", ...]`` for the hunks of ``old`` that
    ``new`` carries changed or moved, then for the hunks only ``new`` has (followed back from the
    new base). ``parsed``: ``parse_steps`` of the upstream changes."""
    out, seen = [], set()
    if new_stack:
        for path, start, end in _new_only_hunks(old, new):
            path, start, end = _place(list(new_stack), new, path, start, end)
            for label, subject, what in _backward_causes(parsed, path, start, end)[:2]:
                seen.add((label, what.split(" around the hunk")[0]))
                out.append(f"upstream {label} ({subject}) {what}")
    for path, start, end, kind in _changed_hunks(old, new):
        path, start, end = _place(old_stack, old, path, start, end)
        lo, hi = start - MARGIN, end + MARGIN
        touched, shifts = [], []
        for label, subject, changes in parsed:
            fc = next((f for f in changes if f.old_path == path), None)
            if fc is None:
                continue
            near = [b for b in fc.blocks if b.old <= hi and b.old + max(len(b.removed), 1) - 1 >= lo]
            above = [b for b in fc.blocks if b.old + len(b.removed) <= lo]
            if fc.old_path != fc.path:
                touched.append((label, subject, f"moved `{fc.old_path}` to `{fc.path}`"))
            if fc.deleted:
                touched.append((label, subject, f"deleted `{path}`"))
                break
            if near:
                touched.append((label, subject, describe(near, path)))
            elif above and kind != "changed":
                delta = sum(len(b.added) - len(b.removed) for b in above)
                if delta:
                    shifts.append((label, subject, describe(above, path, delta)))
            lo, hi = _forward(lo, fc.blocks), _forward(hi, fc.blocks)
            path = fc.path
        for label, subject, what in touched or shifts[-2:]:
            key = (label, what.split(" around the hunk")[0].split(" above the hunk")[0])
            if key not in seen:  # one change named once, where it touches a hunk if it does
                seen.add(key)
                out.append(f"upstream {label} ({subject}) {what}")
    return list(dict.fromkeys(out))[:MAX_REASONS]


def fallback(status: str) -> str:
    """The Reason line when no upstream change touches or shifts the patch's hunks."""
    if status == "modified":
        return "the patch itself changed (no upstream change between the bases touches these lines)"
    return "an earlier patch of the stack moved the lines around it (no upstream change touches them)"
