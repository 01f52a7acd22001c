"""``check``: everything CI must know about the stack, collected into one list of problems.

The rule for records: ``patches/proof.json`` (``prove`` verdicts, mutant scores) and the README's
Proof column describe the stack the maintainer last proved. A contributor's edit needs only
apply, edit, export, check, so a record for another stack is a notice (STALE), not a problem; a
malformed record, or one for this stack that misses patches, is a problem. CI re-proves the stack
with ``prove``; the maintainer refreshes the records at release or bump time, where
``check --strict-records`` makes staleness fail.
"""


from tools.rebase.errors import RebaseError
from tools.rebase.git import names
from tools.rebase.git.safefs import read_nofollow
from tools.rebase.stack.drops import lint_drops, read_drops
from tools.rebase.stack.pin import load_pin
from tools.rebase.stack.recordings import is_merge_edit, recorded_path
from tools.rebase.stack.series import (
    FILE_NAME, REQUIRED_TRAILERS, UPSTREAM_STATUS_WORDS, parse_patch, read_series,
)
from tools.rebase.stack.source import import_base
from tools.rebase.stack.stack import build, export_range
from tools.rebase.proof.hidden_unicode import hidden_controls
from tools.rebase.proof.testids import missing_test


def lint_series(layout):
    """Structural problems of series + patch files; returns (problems, parsed patches)."""
    problems, parsed = [], []
    shown = layout.rel(layout.patches)  # "patches", or "lines/<name>/patches"
    series = read_series(layout.series)
    listed = {}
    for position, entry in enumerate(series.entries, start=1):
        where = f"{shown}/series:{entry.line}"
        if entry.name in listed:
            problems.append(f"{where}: {entry.name} is listed twice (first on line {listed[entry.name]})")
            continue
        listed[entry.name] = entry.line
        path = layout.patches / entry.name
        m = FILE_NAME.match(entry.name)
        if not m:
            problems.append(f"{where}: {entry.name} is not named NNNN-slug.patch")
        elif int(m["number"]) != position:
            problems.append(
                f"{where}: {entry.name} is entry {position} but numbered {m['number']} "
                f"(reordered series? run export to renumber)"
            )
        if not path.is_file():
            problems.append(f"{where}: {entry.name} does not exist")
            continue
        try:
            patch = parse_patch(path)
        except RebaseError as exc:
            problems.append(str(exc))
            continue
        parsed.append(patch)
        for key in REQUIRED_TRAILERS:
            if not patch.trailers.get(key):
                problems.append(f"{shown}/{entry.name}: missing '{key}:' trailer")
        if m and patch.name and patch.name != m["slug"]:
            problems.append(f"{shown}/{entry.name}: Patch-Name {patch.name!r} does not match the file name")
        status = patch.upstream_status.split(" ", 1)[0]
        if patch.upstream_status and status not in UPSTREAM_STATUS_WORDS:
            problems.append(
                f"{shown}/{entry.name}: Upstream-Status {status!r} is not one of {', '.join(UPSTREAM_STATUS_WORDS)}"
            )
        for node_id in patch.tests:
            why = missing_test(layout.root, node_id)
            if why:
                problems.append(f"{shown}/{entry.name}: Tests: {node_id}: {why}")
        problems += hidden_controls(patch, f"{shown}/{entry.name}")
    for path in sorted(layout.patches.glob("*.patch")):
        if path.name not in listed:
            problems.append(f"{shown}/{path.name}: not listed in {shown}/series")
    return problems, parsed, series


def lint_resolutions(layout, patches) -> list:
    """Recorded resolutions a bump would load: ``resolutions/<Patch-Name>/<id>/`` real folders
    holding a ``preimage`` and a ``postimage``, for patches of the series (``patches``: the
    parsed series) or of the line's ``patches/dropped``. Each is a rerere recording (its preimage holds conflict markers) or an edit of
    a cleanly merged file (keyed by its preimage's blob id) that names a file its patch changes."""
    files_of = {p.name: p for p in patches}
    store = layout.resolutions
    shown = layout.rel(store)
    if store.is_symlink():
        return [f"{shown}: must not be a symlink"]
    if not store.exists():
        return []
    if not store.is_dir():
        return [f"{shown}: is not a folder"]
    try:  # a line keeps the resolutions of the patches it drops on purpose (its next refresh meets them)
        dropped = read_drops(layout)
    except RebaseError:  # lint_drops reports it
        dropped = {}
    problems = []
    for patch_dir in sorted(store.iterdir()):
        where = f"{shown}/{patch_dir.name}"
        if patch_dir.is_symlink() or not patch_dir.is_dir():
            problems.append(f"{where}: must be a real folder named after a Patch-Name")
            continue
        if patch_dir.name not in files_of and patch_dir.name not in dropped:
            problems.append(f"{where}: no patch of the series is named {patch_dir.name!r}")
        for entry in sorted(patch_dir.iterdir()):
            here = f"{where}/{entry.name}"
            if entry.is_symlink() or not entry.is_dir():
                problems.append(f"{here}: must be a real folder named after a rerere id")
                continue
            if not names.RERERE_ID.match(entry.name):
                problems.append(f"{here}: {entry.name!r} is not a 40-hex rerere id")
            missing = [image for image in ("preimage", "postimage")
                       if entry.joinpath(image).is_symlink() or not entry.joinpath(image).is_file()]
            problems += [f"{here}: no {image} file (a resolution needs both images)" for image in missing]
            if not missing:
                problems += _lint_recording(here, entry, files_of.get(patch_dir.name))
    return problems


def _lint_recording(here: str, entry, patch) -> list:
    """One recording checked against its patch: a merge edit must name a file the patch changes."""
    try:
        preimage = read_nofollow(entry / "preimage")
        named = recorded_path(entry)
    except RebaseError as exc:
        return [f"{here}: {exc}"]
    edit = is_merge_edit(entry, preimage)
    if named is not None and not edit:
        return [f"{here}: names {named} but is no edit of a merged file (its preimage's blob id is not "
                f"{entry.name}); a rerere recording names no path"]
    if not edit and b"<<<<<<<" not in preimage:
        return [f"{here}: neither a rerere recording (no conflict markers in its preimage) nor an edit of "
                f"a merged file (its preimage's blob id is not {entry.name})"]
    if named is not None and patch is not None and named not in patch.files:
        shown = ", ".join(patch.files) or "no file"
        return [f"{here}: edits {named}, a file {patch.name} does not change ({patch.path.name} changes "
                f"{shown}); a recorded edit applies only to a file of its own patch: file it under the "
                f"patch that changes {named}, or remove it"]
    return []


def bump_in_progress(layout) -> list:
    """The one problem to report while a bump is in progress, else []: ``patches/`` and the
    recorded resolutions are half-way between two bases (the pin and series the old ones, the
    resolutions partly the new base's), so checking them would report the bump's own work as
    problems, and building the stack would disturb the work repo the bump is stopped in."""
    journal = layout.bump_journal
    if not journal.is_file():
        return []
    import json

    try:
        data = json.loads(journal.read_text())
        onto, phase = str(data["onto"]), str(data["phase"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        onto, phase = "a new base", "journal unreadable"
    return [f"a bump onto {onto} is in progress ({phase}; {layout.rel(journal)}): nothing is checked until "
            f"it ends; `python -m tools.rebase bump{layout.line_flag} --continue` finishes it, "
            f"`bump{layout.line_flag} --abort` restores the state before it"]


BASELESS_NOTE = "base-less check: series and resolutions linted; apply/export not verified"


def check_without_base(layout, log=print, strict_records: bool = False) -> list:
    """``check --no-base``: what can be verified with no upstream base at hand (CI cannot fetch a
    line's upstream commit): pin syntax, series, patch files and trailers, Tests: ids, recorded
    resolutions and the proof record. Strict apply and export equality need the base."""
    busy = bump_in_progress(layout)
    if busy:
        return busy
    try:
        pin = load_pin(layout.pin)
    except RebaseError as exc:
        return [str(exc)]
    log(f"pin parsed (base not imported): {pin.display}")
    if pin.kind == "git":
        log(f"pin anchoring NOT verified: whether commit {pin.commit[:12]} is on a branch or tag of {pin.url} "
            f"(not a pull request's) needs upstream; `check` with the base (or --mirror PATH) verifies it")
    problems, parsed, _ = lint_series(layout)
    if not problems:
        log(f"series ok: {len(parsed)} patches")
    problems += lint_resolutions(layout, parsed)
    problems += lint_drops(layout, {p.name for p in parsed})
    if not problems:
        problems += check_records(layout, log, strict_records)
    log(BASELESS_NOTE)
    return problems


RECORDS_RULE = (
    "the STALE records are for another stack, which is not a failure: a contributor's edit needs only "
    "apply, edit, export, check. CI re-proves the stack with `prove`; the maintainer refreshes "
    "patches/proof.json and the README's Proof column at release or bump time with the commands "
    "above (`check --strict-records` fails until then).")


def check_records(layout, log, strict_records: bool) -> list:
    """Problems of the proof record and mutant scores; a record for another stack is logged as
    STALE with the rule, or is a problem with ``strict_records`` (the maintainer's release check)."""
    from tools.rebase.proof.prove_mutants import mutant_record_findings
    from tools.rebase.proof.record import is_stale, read_record

    problems, stale = [], []
    _, proof_problem = read_record(layout)
    (stale if is_stale(proof_problem) else problems).extend([proof_problem] if proof_problem else [])
    mutant_problem, mutants_stale = mutant_record_findings(layout)
    problems += [mutant_problem] if mutant_problem else []
    stale += [mutants_stale] if mutants_stale else []
    if strict_records:
        return problems + [f"{notice} (--strict-records)" for notice in stale]
    for notice in stale:
        log(f"STALE: {notice}")
    if stale:
        log(f"check: {RECORDS_RULE}")
    return problems


def warn_unexported(layout, log) -> None:
    from tools.rebase.stack.workrepo import unexported_commits

    pending = unexported_commits(layout)
    if pending:
        shown = "\n  ".join(f"{sha[:12]} {subject}" for sha, subject in pending[:10])
        log(f"warning: {layout.work} has {len(pending)} commit(s) never exported to patches/ "
            f"(check verifies patches/ only):\n  {shown}\nRun `python -m tools.rebase export` to keep them.")


def check(layout, log=print, strict_records: bool = False) -> list:
    """Return the list of problems (empty means the stack is healthy); records for another stack
    are logged as STALE, or are problems with ``strict_records``."""
    problems = bump_in_progress(layout)
    if problems:
        return problems
    try:
        pin = load_pin(layout.pin)
    except RebaseError as exc:
        return [str(exc)]
    try:
        base = import_base(layout.work, layout.cache, pin)
    except RebaseError as exc:
        return [f"upstream pin: {exc}"]
    log(f"pin ok: {pin.display}")
    warn_unexported(layout, log)
    lint_problems, parsed, series = lint_series(layout)
    lint_problems += lint_resolutions(layout, parsed)
    lint_problems += lint_drops(layout, {p.name for p in parsed})
    problems += lint_problems
    if lint_problems:
        return problems
    log(f"series ok: {len(parsed)} patches")
    try:
        commits = build(layout.work, base, [p.path for p in parsed], three_way=False)
    except RebaseError as exc:
        return problems + [f"apply: {exc}"]
    log("applies to the base with no fuzz")
    tip = commits[-1] if commits else base
    fresh = dict(export_range(layout.work, base, tip))
    for patch in parsed:
        if fresh.get(patch.path.name) != read_nofollow(patch.path):
            problems.append(
                f"{layout.rel(layout.patches)}/{patch.path.name}: differs from a fresh export (edited by hand, or "
                f"exported with other flags); run apply then export to regenerate it"
            )
    if not problems:
        log("fresh export is byte-identical")
    from tools.rebase.proof.listing import readme_is_stale

    problems += check_records(layout, log, strict_records)
    try:
        stale_readme = readme_is_stale(layout)
    except RebaseError as exc:  # markers duplicated or out of order: `list --update-readme` refuses too
        problems.append(str(exc))
        stale_readme = False
    if stale_readme:
        problems.append(f"{layout.rel(layout.readme)}: the patch table is stale; run python -m tools.rebase "
                        f"list --update-readme{layout.line_flag}")
    return problems
