"""Why a patch conflicts: the conflict type per file and the upstream commits that caused it.

Listing every upstream commit that touched a conflicting file buries the one that matters. Here
each conflicting file's three stages are diffed: the hunks where upstream's side ("ours" in the
replay) and the patch ("theirs") change overlapping or adjacent lines of the common base are the
conflict hunks. The upstream side of those hunks is blamed over ``old..new`` upstream history;
lines the upstream side deleted are matched against the removed lines of the commits in that
range. Those commits come first ("changed the conflicting lines"); the others that touched the
files follow as "also touched these files". Lines that came from patches of the stack itself
(replayed ones, or a dropped one in the old stack) are named too.
"""

import re

from tools.rebase.analysis import code_moves
from tools.rebase.git.gitcmd import git, git_proc

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_CONFLICT_LINE = re.compile(r"^CONFLICT \(([^)]+)\): (.*)$")
_HEX40 = re.compile(r"^[0-9a-f]{40} \d+ \d+")
TYPES = ("content", "add/add", "modify/delete", "rename")


def unmerged_stages(work) -> dict:
    """``{path: {stage: blob}}`` of the merge in progress."""
    out = git("ls-files", "-u", "-z", cwd=work)
    stages = {}
    for rec in out.split("\0"):
        if not rec:
            continue
        meta, path = rec.split("\t", 1)
        _, blob, stage = meta.split()
        stages.setdefault(path, {})[int(stage)] = blob
    return stages


def conflict_types(stages: dict, git_output: str = "") -> dict:
    """``{path: type}``: rename when git's message says a rename is involved, else from the stages
    (no base: add/add; a side missing: modify/delete; all three: content)."""
    renamed = set()
    for line in git_output.splitlines():
        m = _CONFLICT_LINE.match(line.strip())
        if m and ("rename" in m[1] or m[1] == "file location"):
            renamed |= {p for p in stages if p in m[2]}
    out = {}
    for path, st in stages.items():
        if path in renamed:
            out[path] = "rename"
        elif 1 not in st and 2 in st and 3 in st:
            out[path] = "add/add"
        elif 1 in st and (2 not in st or 3 not in st):
            out[path] = "modify/delete"
        elif 1 in st:
            out[path] = "content"
        else:
            out[path] = "rename"  # only one side, no base: a file moved under the other side
    return out


def _hunks(work, a: str, b: str) -> list:
    """``[(a_start, a_count, b_start, b_count)]`` of ``git diff -U0`` between two blobs ("" = empty)."""
    empty = git("hash-object", "-w", "-t", "blob", "--stdin", cwd=work, input="").strip() if not (a and b) else ""
    out = git("diff", "-U0", "--no-color", a or empty, b or empty, cwd=work)
    hunks = []
    for line in out.splitlines():
        m = _HUNK.match(line)
        if m:
            hunks.append((int(m[1]), int(m[2] or 1), int(m[3]), int(m[4] or 1)))
    return hunks


def _span(start, count):
    """Base-side line interval a hunk covers; a pure insertion covers the gap after ``start``."""
    return (start, start + count - 1) if count else (start + 0.5, start + 0.5)


def conflict_hunks(work, st: dict) -> list:
    """Upstream-side hunks that overlap (or touch) a patch hunk on the common base:
    ``[(base_start, base_count, ours_start, ours_count)]``."""
    base, ours, theirs = st.get(1, ""), st.get(2, ""), st.get(3, "")
    if not ours:
        return []
    if not base:  # add/add: every difference between the two sides is contested
        return [(0, 0, b0, bn) for b0, bn, _, _ in _hunks(work, ours, theirs)]
    mine = _hunks(work, base, theirs) if theirs else [(1, 10 ** 9, 1, 0)]
    out = []
    for b0, bn, o0, on in _hunks(work, base, ours):
        lo, hi = _span(b0, bn)
        for t0, tn, _, _ in mine:
            tlo, thi = _span(t0, tn)
            if lo <= thi + 1 and tlo <= hi + 1:
                out.append((b0, bn, o0, on))
                break
    return out


def _blame(work, args: list, ranges: list) -> list:
    """Commit ids blamed for the lines of ``ranges`` (``[(start, count)]``), one per line; the
    boundary commit and uncommitted lines give "" and "0"*40 as they come."""
    if not ranges:
        return []
    cmd = ["blame", "--porcelain"]
    for start, count in ranges:
        cmd += ["-L", f"{start},{start + count - 1}"]
    proc = git_proc(*cmd, *args, cwd=work)
    if proc.returncode != 0:
        return []
    shas, boundary, current = [], set(), None
    for line in proc.stdout.splitlines():
        if _HEX40.match(line):
            current = line[:40]
        elif line == "boundary" and current:
            boundary.add(current)
        elif line.startswith("\t") and current:
            shas.append(current)
    return ["" if s in boundary else s for s in shas]


def _merge_ranges(ranges: list, limit: int) -> list:
    clipped = sorted((max(1, s), min(limit, s + n - 1)) for s, n in ranges if n > 0)
    merged = []
    for lo, hi in clipped:
        if hi < lo:
            continue
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return [(lo, hi - lo + 1) for lo, hi in merged]


CLOSEST_SCAN = 80  # upstream versions of a file compared with an sdist's, newest first


def commits_touching(work, upstream_range, files: list) -> list:
    """``[{"commit", "subject"}]`` of upstream commits between the bases touching ``files``."""
    if not files:
        return []
    out = git("log", "--no-merges", "--format=%H %s", f"{upstream_range[0]}..{upstream_range[1]}",
              "--", *files, cwd=work)
    return [{"commit": line[:40], "subject": line[41:]} for line in out.splitlines()]


def closest_upstream(work, new: str, path: str, old_blob: str) -> str:
    """The commit of ``new``'s history whose ``path`` is closest to ``old_blob`` (an sdist's file,
    which has no history): where the old base stood for this file. "" if none."""
    from collections import Counter

    from tools.rebase.analysis.lint import read_blobs

    out = git("log", f"-{CLOSEST_SCAN}", "--format=%H", new, "--", path, cwd=work).split()
    if not out or not old_blob:
        return ""
    specs = [f"{c}:{path}" for c in out]
    blobs = read_blobs(work, specs + [old_blob])
    old_lines = Counter((blobs.get(old_blob) or "").splitlines())
    best, best_cost = "", None
    for c in out:
        text = blobs.get(f"{c}:{path}")
        if text is None:
            continue
        lines = Counter(text.splitlines())  # lines only one side has: cheap, and enough to rank
        cost = sum(((old_lines - lines) + (lines - old_lines)).values())
        if best_cost is None or cost < best_cost:
            best, best_cost = c, cost
        if cost == 0:
            break
    return best


def _blob_id(work, spec: str) -> str:
    proc = git_proc("rev-parse", "--verify", "--quiet", spec, cwd=work)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _map_lines(work, a: str, b: str, ranges: list) -> list:
    """For each line of ``ranges`` in blob ``b``: its line number in blob ``a`` (0 when ``b``
    added or changed it)."""
    hunks = _hunks(work, a, b) if a else None
    out = []
    for start, count in ranges:
        for line in range(start, start + count):
            if hunks is None:
                out.append(0)
                continue
            shift, added = 0, False
            for a0, an, b0, bn in hunks:
                first_b = b0 if bn else b0 + 1
                if bn and b0 <= line < b0 + bn:
                    added = True
                    break
                if first_b <= line:
                    shift += bn - an
            out.append(0 if added else line - shift)
    return out


def _blob_lines(work, blob: str) -> list:
    return git("cat-file", "blob", blob, cwd=work).splitlines() if blob else []


def analyse(work, git_output: str, upstream_range=None, candidates=(), new_base=None, tip=None,
            old_chain=None) -> dict:
    """Explain the conflict in progress in ``work``.

    ``upstream_range``: (old, new) upstream commits whose history is in ``work``; old is None when
    the old base is an sdist: then each file starts at its closest upstream version; ``candidates``:
    ``[{"commit", "subject"}]`` upstream commits of that range touching the files (oldest first);
    ``new_base``/``tip``: the replayed chain so far (its commits are stack patches); ``old_chain``:
    (old base, the patch's old parent) to find stack patches that brought the base-side lines.
    Returns ``{"types": {path: type}, "causes": [...], "also": [...], "files": {path: {...}},
    "stack_context": [commit ids of replayed patches], "old_context": [old patch commit ids]}``.
    """
    stages = unmerged_stages(work)
    types = conflict_types(stages, git_output)
    candidates = list(candidates or [])
    per_file = upstream_range is not None and upstream_range[0] is None
    subjects = {}
    cand_removed = {}
    lines_by_commit, files = {}, {}
    stack_lines, old_lines = {}, {}
    for path, st in sorted(stages.items()):
        hunks = conflict_hunks(work, st)
        info = {"type": types[path], "hunks": [[b0, bn, o0, on] for b0, bn, o0, on in hunks], "causes": []}
        files[path] = info
        ours_lines = _blob_lines(work, st.get(2, ""))
        ranges = _merge_ranges([(o0, on) for _, _, o0, on in hunks], len(ours_lines))
        blamed = []
        rng = upstream_range
        if per_file:
            start = closest_upstream(work, upstream_range[1], path, _blob_id(work, f"{old_chain[0]}:{path}")
                                     if old_chain else "")
            rng = (start, upstream_range[1]) if start else None
            info["upstream_from"] = start
            known = {c["commit"] for c in candidates}
            candidates += [c for c in (commits_touching(work, rng, [path]) if rng else []) if c["commit"] not in known]
        subjects.update({c["commit"]: c["subject"] for c in candidates})
        if rng and ranges and st.get(2):
            # The upstream side is the new base plus the patches replayed so far: blame the lines
            # that are the new base's in its own history; the others came from the stack.
            up_blob = _blob_id(work, f"{rng[1]}:{path}")
            mapped = _map_lines(work, up_blob, st[2], ranges)
            up_lines = [n for n in mapped if n]
            up_ranges = _merge_ranges([(n, 1) for n in up_lines], 10 ** 9)
            got = iter(_blame(work, [f"{rng[0]}..{rng[1]}", "--", path], up_ranges))
            blamed = [next(got, "") if n else "0" * 40 for n in mapped]
        mine = {}
        for sha in blamed:
            if sha and sha != "0" * 40:
                mine[sha] = mine.get(sha, 0) + 1
        from_stack = any(s == "0" * 40 for s in blamed) or not rng
        if tip and new_base and ranges and from_stack:
            for sha in _blame(work, [f"{new_base}..{tip}", "--", path], ranges):
                if sha and sha != "0" * 40:
                    stack_lines[sha] = stack_lines.get(sha, 0) + 1
        # Lines the upstream side deleted cannot be blamed forward: match their text instead.
        base_lines = _blob_lines(work, st.get(1, ""))
        gone = {base_lines[i - 1].strip() for b0, bn, _, on in hunks if bn and not on
                for i in range(b0, b0 + bn) if 0 < i <= len(base_lines) and base_lines[i - 1].strip()}
        if gone and candidates:
            cand_removed.update(_removed_lines(work, [c["commit"] for c in candidates
                                                      if c["commit"] not in cand_removed]))
            for sha, removed in cand_removed.items():
                if removed.get(path, set()) & gone:
                    mine[sha] = mine.get(sha, 0) + len(removed[path] & gone)
        if old_chain and st.get(1):
            base_ranges = _merge_ranges([(b0, bn) for b0, bn, _, _ in hunks if bn], len(base_lines))
            for sha in _blame(work, [f"{old_chain[0]}..{old_chain[1]}", "--", path], base_ranges):
                if sha and sha != "0" * 40:
                    old_lines[sha] = old_lines.get(sha, 0) + 1
        stack_added = _added_by_old_stack(work, old_chain, path, st)
        if stack_added:  # the file came from a patch that did not come along, not from upstream
            old_lines[stack_added] = old_lines.get(stack_added, 0) + 1
        elif rng and not any(s and s != "0" * 40 for s in blamed):  # blame found nothing: follow the code
            went = code_moves.where_it_went(work, rng, path, _patch_context(work, st, base_lines),
                                             bool(_blob_id(work, f"{rng[1]}:{path}")))
            for finding in went:
                mine[finding["commit"]] = mine.get(finding["commit"], 0) + 1
                subjects.setdefault(finding["commit"], finding["subject"])
            if went:
                info["went"] = [{"commit": f["commit"], "how": f["how"]} for f in went]
        order = {c["commit"]: k for k, c in enumerate(candidates)}
        info["causes"] = sorted(mine, key=lambda s: (order.get(s, len(order)), s))
        for sha, n in mine.items():
            lines_by_commit[sha] = lines_by_commit.get(sha, 0) + n
    order = {c["commit"]: k for k, c in enumerate(candidates)}
    causes = [_cause(work, s, subjects, lines_by_commit[s], files)
              for s in sorted(lines_by_commit, key=lambda s: (order.get(s, len(order)), s))]
    named = {c["commit"] for c in causes}
    also = [c for c in candidates if c["commit"] not in named]
    return {"types": types, "causes": causes, "also": also, "files": files,
            "stack_context": sorted(stack_lines), "old_context": sorted(old_lines)}


def _added_by_old_stack(work, old_chain, path: str, st: dict) -> str:
    """The old patch that added ``path`` when the new side lacks it and the old base did too (a
    file of the stack whose patch was dropped in this bump, say), else ""."""
    if not old_chain or st.get(2) or not st.get(1) or _blob_id(work, f"{old_chain[0]}:{path}"):
        return ""
    added = git("log", "--diff-filter=A", "--format=%H", f"{old_chain[0]}..{old_chain[1]}", "--", path,
                cwd=work).split()
    return added[-1] if added else ""


def _cause(work, sha: str, subjects: dict, lines: int, files: dict) -> dict:
    cause = {"commit": sha, "subject": subjects.get(sha) or code_moves.commit_subject(work, sha), "lines": lines,
             "files": sorted(p for p, i in files.items() if sha in i["causes"])}
    how = sorted({f"{p}: {w['how']}" for p, i in files.items() for w in i.get("went", []) if w["commit"] == sha})
    if how:
        cause["how"] = "; ".join(how)
    return cause


def _patch_context(work, st: dict, base_lines: list, around: int = 2) -> list:
    """The base-side lines the patch changes in a file, with ``around`` lines each side: what the
    patch needs of upstream's code, to be followed when blame cannot."""
    if not st.get(1):
        return []
    if not st.get(3):
        return base_lines
    picked = set()
    for b0, bn, _, _ in _hunks(work, st[1], st[3]):
        first = b0 if bn else b0 + 1
        picked.update(range(max(1, first - around), min(len(base_lines), first + max(bn, 1) - 1 + around) + 1))
    return [base_lines[i - 1] for i in sorted(picked)]


def _removed_lines(work, commits: list) -> dict:
    """``{commit: {path: {stripped removed line}}}`` from one ``git show`` over all commits."""
    if not commits:
        return {}
    out = git("show", "--no-color", "-U0", "--format=%x01%H", *commits, cwd=work)
    result, current, path = {}, None, None
    for line in out.split("\n"):
        if line.startswith("\x01"):
            current = line[1:].strip()
            result[current] = {}
        elif line.startswith("--- a/"):
            path = line[6:]
        elif line.startswith("+++ b/"):
            path = line[6:] if path is None or path == "/dev/null" else path
        elif line.startswith("diff --git"):
            path = None
        elif line.startswith("-") and not line.startswith("---") and current and path and line[1:].strip():
            result[current].setdefault(path, set()).add(line[1:].strip())
    return result


def summary_lines(analysis: dict, names: dict = None, dropped: dict = None) -> list:
    """Human lines for the stop message: types, the causing commits, then the others.

    ``names``: {commit: patch label} for stack commits; ``dropped``: {old commit: label} of patches
    dropped earlier in this bump."""
    names, dropped = names or {}, dropped or {}
    out = []
    for path, info in sorted(analysis["files"].items()):
        since = (f"; upstream history read from {info['upstream_from'][:12]}, its closest version to the old base"
                 if info.get("upstream_from") else "")
        out.append(f"  {path} ({info['type']} conflict{since})")
    if analysis["causes"]:
        out.append("upstream commits that changed the conflicting lines:")
        out += [f"  {c['commit'][:12]} {c['subject']} ({c.get('how') or ', '.join(c['files'])})"
                for c in analysis["causes"]]
    if analysis["also"]:
        out.append("also touched these files:")
        out += [f"  {c['commit'][:12]} {c['subject']}" for c in analysis["also"]]
    from_stack = [names.get(s, s[:12]) for s in analysis.get("stack_context", [])]
    if from_stack:
        out.append("conflicting context comes from earlier patches of the stack: " + ", ".join(from_stack))
    gone = [dropped[s] for s in analysis.get("old_context", []) if s in dropped]
    if gone:
        out.append("the base side of the conflict was introduced by a patch dropped in this bump: "
                   + ", ".join(gone) + " (this patch depended on it)")
    return out
