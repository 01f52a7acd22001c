"""The last bump's record, rebuilt from the checkout's git history when this machine did not run it.

A fresh clone has no ``.rebase/last-bump/record.json``, yet plain ``report`` must regenerate the
committed ``REBASE_REPORT.*`` byte for byte. The bump is the last commit that changed the pin: its
parent's ``patches/`` + pin is the old stack, its own the new one; ``apply`` builds both with the
same commit ids the bump saw. What only the bump knew (patches absorbed or dropped on purpose, how
a conflict was resolved, test results) is read back from the committed ``REBASE_REPORT.json``.
"""

import json

from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import git, git_proc

# Notes the bump attaches to new commits (bump.py ``_record``); anything else in a row's note
# comes from the classification and is recomputed.
# A patch that merged cleanly and was given a recorded edit (replay.py, merge_edits.py).
CLEAN_EDITED_NOTE = "resolved by a recorded resolution (edits of a clean merge)"
BUMP_NOTES = ("conflict resolved by hand", "conflict resolved by a recorded resolution", CLEAN_EDITED_NOTE)
DROPPED_NOTE = "removed on purpose by the maintainer"


def _pin_commit(lay) -> str:
    if git_proc("rev-parse", "--verify", "--quiet", "HEAD", cwd=lay.root).returncode != 0:
        raise RebaseError(f"no bump recorded in this checkout and {lay.root} has no git history to rebuild "
                          f"it from; compare two states with --old REV [--new REV], or two ranges with --repo")
    rel = lay.pin.relative_to(lay.root).as_posix()
    found = git("log", "-1", "--format=%H %P", "HEAD", "--", rel, cwd=lay.root).split()
    if len(found) < 2:
        raise RebaseError(f"no bump recorded in this checkout, and no commit of its history changed {rel} "
                          f"after creating it; compare two states with --old REV [--new REV], or two "
                          f"ranges with --repo")
    return found[0]


def _committed_report(lay) -> tuple:
    """``(report, bump_facts(report))`` of the committed JSON report, whose shape a pull request
    may have changed: any defect is an error naming the file."""
    rel = lay.report_json.relative_to(lay.root).as_posix()
    proc = git_proc("show", f"HEAD:./{rel}", cwd=lay.root)
    if proc.returncode != 0:
        raise RebaseError(f"no bump recorded in this checkout and HEAD has no {rel} to rebuild it from")
    try:
        data = json.loads(proc.stdout)
        if not all(isinstance(data[side]["tip"], str) for side in ("old", "new")):
            raise TypeError("a tip is not a commit id")
        return data, bump_facts(data)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as exc:
        raise RebaseError(f"HEAD:{rel} is not a bump report ({exc.__class__.__name__}: {exc})") from None


def _absorbed_how(note: str, upstream: str, new_label: str) -> str:
    """Invert the absorbed row's note (``classify`` + ``build_report``) back to the bump's ``how``."""
    for prefix in (f"absorbed upstream in {upstream[:12]}" if upstream else None,
                   f"absorbed upstream in {new_label}", "absorbed upstream"):
        if prefix and note.startswith(prefix):
            rest = note[len(prefix):]
            return rest[2:-1] if rest.startswith(" (") and rest.endswith(")") else ""
    return ""


def bump_facts(data: dict):
    """``(hints, tests)`` of ``build_report`` recovered from a report's rows."""
    hints = {"absorbed": {}, "dropped": [], "notes": {}, "drop_notes": {}}
    tests = {}
    new_label = data["new"]["base"].get("label", "")
    for row in data["mapping"]:
        note = row.get("note", "")
        if row["status"] == "absorbed" and row["old"]:
            upstream = row.get("upstream_commit", "")
            hints["absorbed"][row["old"][0]["commit"]] = [upstream, _absorbed_how(note, upstream, new_label)]
        elif row["status"] == "dropped" and row["old"] and note.split("; ")[0] == DROPPED_NOTE:
            hints["dropped"].append(row["old"][0]["commit"])
            if note != DROPPED_NOTE:  # the bump's drop note: dependents and orphaned tests
                hints["drop_notes"][row["old"][0]["commit"]] = note
        for extra in BUMP_NOTES:  # partial-absorption notes may follow the bump's own
            if row["new"] and extra in note.split("; "):
                hints["notes"][row["new"][-1]["commit"]] = extra
        if row.get("tests") and row["new"]:
            tests[row["new"][0]["commit"]] = dict(row["tests"])
    return hints, tests


def record_from_history(lay, stack_at) -> dict:
    """The record ``bump`` would have written, rebuilt from git history (``stack_at(lay, rev)``
    builds the stack a commit's ``patches/`` + pin describe: ``(pin, base, tip)``)."""
    commit = _pin_commit(lay)
    data, (hints, tests) = _committed_report(lay)
    old_pin, old_base, old_tip = stack_at(lay, f"{commit}^")
    new_pin, new_base, new_tip = stack_at(lay, commit)
    if (old_tip, new_tip) != (data["old"]["tip"], data["new"]["tip"]):
        raise RebaseError(
            f"the committed {lay.report_json.name} does not describe the bump in {commit[:12]}: rebuilding "
            f"{commit[:12]}^ and {commit[:12]} gives tips {old_tip[:12]} and {new_tip[:12]}, the report "
            f"names {data['old']['tip'][:12]} and {data['new']['tip'][:12]}")
    return {"old_pin": old_pin.to_toml(), "new_pin": new_pin.to_toml(), "old_base": old_base,
            "old_tip": old_tip, "new_base": new_base, "new_tip": new_tip, "hints": hints, "tests": tests}
