"""The report's "Review focus": per patch, what a reviewer should read first.

A patch is credited only with its own files and the upstream commits that touched them (crediting
every stack file any upstream commit touched buried the real interactions under unrelated ones).
Text-level statuses miss semantic interactions, so a patch that re-applied unchanged next to an
upstream change in one of its files is listed too.
"""

QUIET = ("identical", "renumbered", "message-only")
SHOWN_COMMITS = 4


def _own_files(entry: dict) -> set:
    side = "new" if entry["new"] else "old"
    return {path for files in entry["files"][side] for path, _, _ in files}


def _entry_files(churn_entry: dict) -> set:
    return set(churn_entry["files"]) if "files" in churn_entry else {churn_entry["file"]}


def review_focus(mapping: list, churn: dict) -> list:
    focus = []
    for e in mapping:
        number = (e["new_numbers"] or e["old_numbers"] or [0])[0]
        label = f"#{number} {e.get('patch_name') or (e['new'] or e['old'])[0]['subject']}"
        own = _own_files(e)
        touching = [c for c in churn["entries"] if _entry_files(c) & own] if e["new"] else []
        changed = sorted(set().union(*(_entry_files(c) for c in touching)) & own) if touching else []
        commits = [c["commit"] for c in touching if "commit" in c]
        upstream_note = ""
        if changed:
            upstream_note = (f"upstream changed {', '.join(f'`{f}`' for f in changed)}, which it also touches: "
                             f"check the interaction")
            if commits:
                shown = ", ".join(c[:12] for c in commits[:SHOWN_COMMITS])
                more = f" and {len(commits) - SHOWN_COMMITS} more" if len(commits) > SHOWN_COMMITS else ""
                upstream_note += f" (upstream {'commit' if len(commits) == 1 else 'commits'} {shown}{more})"
        item = None
        if e["status"] not in QUIET:
            why = f"{e['status']}: {e['note']}" if e["note"] else e["status"]
            item = {"patch": label, "why": f"{why}; {upstream_note}" if upstream_note else why}
        elif upstream_note:
            item = {"patch": label, "why": f"{e['status']}, but {upstream_note}"}
        if item:
            item.update(files=changed, commits=commits)
            focus.append(item)
    return focus
