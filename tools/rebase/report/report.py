"""The bump report as data (the JSON twin of REBASE_REPORT.md; the Markdown is rendered from it).

``build_report`` compares two stacks given as ranges of one git repo. Everything in the output is
derived from the inputs (commit ids, the bases' own dates), ordered stably, so the same inputs give
byte-identical files.
"""

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tools.rebase.analysis.classify import STATUSES, classify, order_rows, range_diff_pairs
from tools.rebase.analysis.diffparse import fill_patch_ids, find_absorbing_commit, read_range, upstream_commits
from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import git, git_proc, rev_parse
from tools.rebase.analysis import absorption, fingerprints, inbase, reasons, reimplemented, whereabouts
from tools.rebase.analysis.basecompare import base_specs, committer_time, downgrade_warnings, package_changes
from tools.rebase.analysis.lint import read_blobs
from tools.rebase.analysis.review import review_focus
from tools.rebase.analysis.unreached import flag_unreached

SCHEMA = "fork-rebase-report/1"
CHURN_DIFF_LINES = 120  # per file, in the sdist churn section


def utc(ts: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def commit_dates(repo: Path, commits, objects=None, subjects=True) -> dict:
    """``{commit: (committer time, subject)}``: the times from ``objects`` (raw commit texts
    already read) when they hold them and no subject is wanted, else from one git show."""
    wanted = sorted(set(c for c in commits if c))
    objects = objects or {}
    found = {c: (committer_time(objects.get(c)), "") for c in wanted}
    if not subjects and all(when is not None for when, _ in found.values()):
        return found
    out = git("show", "-s", "--format=%H %ct %s", *wanted, "--", cwd=repo) if wanted else ""
    found = {}
    for line in out.splitlines():
        sha, when, subject = (line.split(" ", 2) + [""])[:3]
        found[sha] = (int(when), subject)
    return found


def base_info(repo: Path, commit: str, pin=None, real: str = "", shown=None) -> dict:
    """Describe a base: from its pin when it has one, else from the commit itself. ``shown``:
    ``commit_dates`` of the base (and ``real``) when the caller already has them."""
    shown = shown if shown is not None else commit_dates(repo, [commit, real])
    when, subject = shown[commit]
    info = {"commit": commit, "date": utc(when)}
    if pin is None:
        info.update(kind="commit", label=commit[:12], subject=subject)
    elif pin.kind == "pypi":
        info.update(kind="pypi", label=f"{pin.package} {pin.version}", package=pin.package,
                    version=pin.version, sha256=pin.sha256)
    else:
        info.update(kind="git", label=f"{pin.ref or pin.commit[:12]}", url=pin.url,
                    upstream_commit=pin.commit, ref=pin.ref)
        if real:
            info["date"] = utc(shown[real][0])
    return info


def _ref(c) -> dict:
    return {"commit": c.commit, "subject": c.subject}


def build_report(repo: Path, old_base: str, old_tip: str, new_base: str, new_tip: str,
                 old_pin=None, new_pin=None, upstream_range=None, hints=None, tests=None,
                 trusted=False) -> dict:
    """Compare ``old_base..old_tip`` with ``new_base..new_tip`` in ``repo``.

    ``upstream_range``: ``(old, new)`` upstream commits whose history is in ``repo`` (git pins);
    without it, ``old_base..new_base`` is used when old_base is an ancestor of new_base.
    ``hints``: what a bump knows: ``{"absorbed": {old commit: [upstream, how]}, "dropped":
    [old commit], "notes": {new commit: note}}``. ``tests``: ``{new commit: {node id: outcome}}``.
    ``trusted``: the ranges come from the tool itself (skip checking that bases precede tips).
    """
    repo = Path(repo)
    old_base, old_tip, new_base, new_tip = _resolve_commits(repo, (old_base, old_tip, new_base, new_tip))
    # range-diff (the slowest git call here) and the package counts need only the ids: they run
    # in the background next to the two logs below (each is a git process; the machine's other
    # core takes it). Their results are read where they were computed before.
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        rd_job = pool.submit(range_diff_pairs, repo, f"{old_base}..{old_tip}", f"{new_base}..{new_tip}")
        package_job = pool.submit(package_changes, repo, old_base, new_base) if old_base != new_base else None
        old, new = _read_stacks(repo, old_base, old_tip, new_base, new_tip, trusted)
        rd_pairs, rd_raw = rd_job.result()
    finally:
        pool.shutdown(wait=True)  # also on an error: no git process outlives the call
    hints = hints or {}
    if upstream_range is None and not (old_pin and new_pin) and old_base != new_base and git_proc(
            "merge-base", "--is-ancestor", old_base, new_base, cwd=repo).returncode == 0:
        upstream_range = (old_base, new_base)
    stack_files = sorted({f.path for c in old + new for f in c.files}
                         | {f.old_path for c in old + new for f in c.files})
    upstream = upstream_commits(repo, *upstream_range, stack_files) if upstream_range else []

    rows, lines = _pair_rows(repo, old, new, rd_pairs, hints, upstream, upstream_range,
                             (old_base, new_base, new_tip))
    old_info, new_info, objects = _describe_bases(repo, old_base, new_base, old_pin, new_pin, upstream_range)
    new_label = new_info["label"] if new_pin else f"the new base {new_base[:12]}"
    tests = tests or {}
    reason_steps = _reason_steps(repo, rows, upstream, upstream_range, old_base, new_base, new_info)
    sides = (old, new, lines, reason_steps)
    mapping = [_mapping_entry(repo, row, hints, upstream, new_label, tests, sides) for row in rows]
    if old_base != new_base:  # a clean merge into code the new base no longer reaches is not "renumbered"
        flag_unreached(repo, mapping, old_tip, new_tip)
    counts = {s: 0 for s in STATUSES}
    for entry in mapping:
        counts[entry["status"]] += 1
    churn = _upstream_churn(repo, new or old, old_base, new_base, upstream_range, upstream, stack_files)
    if old_base != new_base:
        churn["package_changes"] = package_job.result()
    review = review_focus(mapping, churn)

    return {
        "schema": SCHEMA,
        "old": {"base": old_info, "tip": old_tip, "count": len(old)},
        "new": {"base": new_info, "tip": new_tip, "count": len(new)},
        "counts": counts,
        "mapping": mapping,
        "upstream_churn": churn,
        "review": review,
        "warnings": downgrade_warnings(repo, old_base, new_base, old_pin, new_pin, objects)
        if old_base != new_base else [],
        "tests_run": bool(tests),
        "range_diff": rd_raw,
    }


def _resolve_commits(repo: Path, revs: tuple) -> list:
    """The four revisions as full commit ids, in one git call; a bad one is named."""
    for rev in revs:
        if rev.startswith("-"):
            raise RebaseError(f"{repo}: revision {rev!r} starts with '-' (it would be read as a git option)")
    proc = git_proc("rev-parse", *(f"{r}^{{commit}}" for r in revs), cwd=repo)
    resolved = proc.stdout.split()
    if proc.returncode != 0 or len(resolved) != 4:
        for rev in revs:
            if not rev_parse(repo, rev):
                raise RebaseError(f"{repo}: {rev!r} does not name a commit")
        raise RebaseError(f"{repo}: cannot resolve {revs}: {proc.stderr.strip()}")
    return resolved


def _pair_rows(repo: Path, old: list, new: list, rd_pairs, hints: dict, upstream: list, upstream_range,
               bases: tuple):
    """``(rows, upstream lines)``: old and new patches paired into report rows; an old patch nobody
    claims is looked up upstream (the commit that absorbed it, in the stack's files or anywhere in the
    range, or a likely re-implementation) or in the new tree (its reverse applies) before it counts
    as dropped."""
    old_base, new_base, _ = bases
    by_commit = {c.commit: i for i, c in enumerate(old)}
    dropped = {by_commit[c] for c in hints.get("dropped", []) if c in by_commit}
    absorbed = {}
    for sha, (commit, how) in sorted(hints.get("absorbed", {}).items()):
        if sha in by_commit:
            absorbed[by_commit[sha]] = (commit, how)
    lines = fingerprints.UpstreamLines(upstream)  # commits whose effect on a patch was undone drop out
    in_base = inbase.lines_in_base(repo, old_base, new_base, old, new)
    for i, (n, total) in sorted(inbase.mostly_in_base(old, in_base).items()):
        if i not in absorbed and i not in dropped:  # absorption weighs before any pairing
            absorbed[i] = _in_base_absorber(repo, old[i], lines.live(old[i]) if upstream else [],
                                            in_base[i], n, total)
    rows_probe = classify(old, new, rd_pairs, absorbed, dropped, in_base=in_base)
    candidates = [row.old[0] for row in rows_probe  # old commits nobody claimed
                  if row.status == "dropped" and row.old and by_commit[row.old[0].commit] not in dropped]
    found, likely, not_carried = whereabouts.search(repo, {by_commit[c.commit]: c for c in candidates}, upstream,
                                                    upstream_range, lines, bases, in_base)
    absorbed.update(found)
    rows = order_rows(classify(old, new, rd_pairs, absorbed, dropped, likely, in_base))
    for row in rows:  # say what the search covered, so "not found" is a finding
        i = by_commit[row.old[0].commit] if row.old else None
        if upstream_range and row.status == "dropped" and i not in dropped:
            row.notes = [not_carried.get(i) or reimplemented.not_found(row.old[0], upstream)]
    return rows, lines


def _in_base_absorber(repo: Path, patch, live: list, in_base, n: int, total: int) -> tuple:
    """``(upstream commit or "", how)`` for a patch whose added lines are mostly in the new base."""
    commit, how = find_absorbing_commit(repo, patch, live) if live else (None, "")
    commit = commit or absorption.carrier(in_base, live)
    if n < total:
        how = f"{n} of its {total} added lines are in the new base"
    elif not commit:
        how = "its change is already in the new base"
    return commit or "", how


def _describe_bases(repo: Path, old_base: str, new_base: str, old_pin, new_pin, upstream_range):
    """``(old base info, new base info, objects)``; ``objects``: the bases' raw commits and version
    files, read once, which the downgrade warnings read again."""
    old_real = upstream_range[0] if upstream_range and old_pin else ""
    new_real = upstream_range[1] if upstream_range and new_pin else ""
    # One cat-file call for the bases: commit objects (dates) and version files (downgrades);
    # subjects only appear for bases without a pin.
    specs = base_specs(old_base, new_base) + [c for c in (old_real, new_real) if c]
    objects = read_blobs(repo, list(dict.fromkeys(specs)))
    shown = commit_dates(repo, [old_base, new_base, old_real, new_real], objects,
                         subjects=old_pin is None or new_pin is None)
    old_info = base_info(repo, old_base, old_pin, old_real, shown)
    new_info = base_info(repo, new_base, new_pin, new_real, shown)
    return old_info, new_info, objects


def _mapping_entry(repo: Path, row, hints: dict, upstream: list, new_label: str, tests: dict, sides) -> dict:
    """One row of the report's mapping: the commits on both sides, their notes, where an absorbed
    change went, why an adapted patch changed, and the row's test results. ``sides``: ``(old
    commits, new commits, upstream lines, Reason steps)``."""
    old, new, lines, reason_steps = sides
    notes = hints.get("notes", {})
    entry = {
        "status": row.status,
        "old": [_ref(c) for c in row.old],
        "new": [_ref(c) for c in row.new],
        "old_numbers": [c.number for c in row.old],
        "new_numbers": [c.number for c in row.new],
        "note": "; ".join(row.notes + [notes[c.commit] for c in row.new if c.commit in notes]),
        "files": {  # per commit of the row, in the order of "old"/"new": [path, added, removed]
            "old": [[[f.path, f.added, f.removed] for f in c.files] for c in row.old],
            "new": [[[f.path, f.added, f.removed] for f in c.files] for c in row.new],
        },
    }
    if row.status == "dropped" and row.old[0].commit in hints.get("drop_notes", {}):
        entry["note"] = hints["drop_notes"][row.old[0].commit]  # dependents and orphaned tests
    if upstream and len(row.old) == len(row.new) == 1 and row.status in ("modified", "merged", "split"):
        # where the missing part went
        parts = absorption.partial(repo, row.old[0], row.new[0], lines.live(row.old[0]))
        if parts:
            entry["note"] = "; ".join([entry["note"], *(n for _, n in parts)])
            entry["partially_absorbed_by"] = sorted({c for c, _ in parts})
    whole = row.status == "absorbed" and not row.partial and upstream
    pieces = absorption.pieces(row.old[0], lines.live(row.old[0])) if whole else []
    if row.folded:
        entry["folded_into"] = [_ref(c) for c in row.folded]
    if pieces:  # no single commit carries all of it
        entry["upstream_commits"] = pieces
        entry["note"] = f"absorbed upstream in pieces by {', '.join(c[:12] for c in pieces)}"
    if row.upstream:
        entry["upstream_commit"] = row.upstream
    elif row.status == "absorbed" and not pieces:  # no history to search (sdist): say where it went
        entry["note"] = re.sub(r"^((?:partially )?absorbed upstream)",
                               lambda m: f"{m[1]} in {new_label}", entry["note"], count=1)
    named = row.new or row.old
    entry["patch_name"] = named[0].name if named else ""
    entry["upstream_status"] = named[0].trailer("Upstream-Status") if named else ""
    if row.interdiff:
        entry["interdiff"] = row.interdiff
    if row.status in ("modified", "refreshed") and len(row.old) == len(row.new) == 1:
        entry["reasons"] = reasons.reasons(row.old[0], row.new[0], old, reason_steps, new) or [
            reasons.fallback(row.status)]
    if row.edges:  # [old number, new number, lines, share of old, share of new]
        entry["edges"] = [list(e) for e in row.edges]
    results = {}
    for c in row.new:
        results.update(tests.get(c.commit, {}))
    if results:
        entry["tests"] = dict(sorted(results.items()))
    return entry


def _reason_steps(repo: Path, rows: list, upstream: list, upstream_range, old_base: str, new_base: str,
                  new_info: dict) -> list:
    """The upstream changes Reason lines are drawn from: the upstream commits when history is there,
    else the bases' own diff of the files the adapted patches touch (one git call)."""
    adapted = [r for r in rows if r.status in ("modified", "refreshed") and len(r.old) == len(r.new) == 1]
    if not adapted or old_base == new_base:
        return []
    paths = sorted({p for r in adapted for c in r.old for f in c.files for p in (f.path, f.old_path)})
    if upstream_range:
        return reasons.parse_steps([(c.commit[:12], c.subject, c.diff) for c in upstream], paths)
    diff = git("diff", "--no-renames", "-U0", old_base, new_base, "--", *paths, cwd=repo)
    return reasons.parse_steps([(new_info["label"], "diff of the bases", diff)], paths)


def _upstream_churn(repo: Path, commits: list, old_base: str, new_base: str, upstream_range, upstream: list,
                    stack_files: list) -> dict:
    """What upstream changed under the stack: its commits touching the stack's files (git pins), else
    per file the diff between the bases (sdists), each with the numbers of the patches touching it."""
    churn = {"kind": "commits" if upstream_range else "files", "entries": []}
    touching = _patches_by_file(commits)
    if upstream_range:
        for c in upstream:
            touched = sorted({f.path for f in c.files} & set(stack_files))
            churn["entries"].append({"commit": c.commit, "subject": c.subject, "files": touched,
                                     "patches": _numbers_touching(touching, touched)})
    elif old_base != new_base:
        # One git call: the numstat lines, a blank line, then the -U2 patch of the same files.
        both = git("diff", "--no-renames", "-U2", "--numstat", "-p", old_base, new_base, "--", *stack_files,
                   cwd=repo) if stack_files else ""
        out, _, whole = both.partition("\n\n")
        per_file = {}  # split per file
        for chunk in re.split(r"(?m)^(?=diff --git )", whole):
            if chunk.startswith("diff --git "):
                per_file[chunk.split("\n", 1)[0][len("diff --git "):]] = chunk
        for line in out.splitlines():
            added, removed, path = line.split("\t", 2)
            diff = per_file.get(f"a/{path} b/{path}", "")
            if not diff:
                diff = git("diff", "--no-renames", "-U2", old_base, new_base, "--", path, cwd=repo)
            lines = diff.splitlines()
            if len(lines) > CHURN_DIFF_LINES:
                lines = lines[:CHURN_DIFF_LINES] + [f"... ({len(diff.splitlines()) - CHURN_DIFF_LINES} more lines)"]
            churn["entries"].append({"file": path, "added": added, "removed": removed,
                                     "patches": _numbers_touching(touching, [path]),
                                     "diff": "\n".join(lines)})
    return churn


def _read_stacks(repo: Path, old_base: str, old_tip: str, new_base: str, new_tip: str, trusted: bool):
    """Both ranges as Commits (with patch-ids), after checking each is a linear range."""
    stacks = []
    for base, tip, side in ((old_base, old_tip, "old"), (new_base, new_tip, "new")):
        if not trusted and git_proc("merge-base", "--is-ancestor", base, tip, cwd=repo).returncode != 0:
            raise RebaseError(f"{side} range: {base[:12]} is not an ancestor of {tip[:12]} in {repo}")
        commits, merges = read_range(repo, base, tip)
        if merges:
            # A merge's own change would vanish from the report (its diff is not listed).
            subject = git("show", "-s", "--format=%s", merges[0], cwd=repo).strip()
            raise RebaseError(
                f"{side} range {base[:12]}..{tip[:12]} contains {len(merges)} merge commit(s), e.g. "
                f"{merges[0][:12]} ({subject!r}); the report compares linear patch stacks only "
                f"(rebase the range onto its base, or pass the range of a linear branch)"
            )
        stacks.append(commits)
    fill_patch_ids(repo, stacks[0] + stacks[1])  # both stacks in one git call
    return stacks


def _patches_by_file(commits: list) -> dict:
    out = {}
    for c in commits:
        for f in c.files:
            out.setdefault(f.path, set()).add(c.number)
    return out


def _numbers_touching(touching: dict, paths) -> list:
    return sorted(set().union(*(touching.get(p, set()) for p in paths))) if paths else []


def dumps(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_report(data: dict, md_path: Path, json_path: Path = None) -> None:
    from tools.rebase.report.render import render_markdown

    for path, text in ((md_path, render_markdown(data)), (json_path, dumps(data) if json_path else None)):
        if path is None:
            continue
        path = Path(path)
        from tools.rebase.git.safefs import write_file

        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path.parent, path, text)  # exclusive random temporary, never through a link
