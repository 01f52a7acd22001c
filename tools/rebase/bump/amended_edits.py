"""Recorded edits made at a test stop: the amendments of cleanly merged patches, kept as edits
of the blob the next replay will give each file (``merge_edits.py``)."""

from pathlib import Path

from tools.rebase.bump.merge_edits import blob_at, changed_paths, export_merge_edits
from tools.rebase.git.gitcmd import git

# ---------------------------------------------------------------- edits made at a test stop
#
# At a test stop the maintainer amends patch commits in the work repo. A patch that merged cleanly
# merges the same way on the next bump, so its amendment is kept like a stop's edit of a cleanly
# merged file, keyed by the blob the replay will give the file at that patch: the merged blob when
# the patch changes the file and the file came to it unamended, the parent's blob when the patch
# leaves the file alone (upstream's refusal removed in a file the patch did not touch).


def _own_lines(work: Path, commit: str, path: str) -> list:
    """The lines ``commit`` adds and removes in ``path`` (no positions: they move with its parent)."""
    out = git("diff", "-U0", "--no-color", "--no-ext-diff", f"{commit}^", commit, "--", path, cwd=work)
    return [line for line in out.splitlines()
            if line[:1] in ("+", "-") and not line.startswith(("+++ ", "--- "))]



def export_amended_edits(work: Path, store: Path, patch_name: str, merged: str, amended: str):
    """Store what amending ``merged`` (the commit the bump made for ``patch_name``) into ``amended``
    changed; return (ids written, paths that cannot be recorded: an added file, or a file both the
    patch and an earlier amendment changed, whose merged blob is not known before the replay)."""
    if merged == amended:
        return [], []
    touched = set(changed_paths(work, f"{merged}^", merged))
    keys, skipped = {}, []
    for path in changed_paths(work, merged, amended):
        if _own_lines(work, merged, path) == _own_lines(work, amended, path):
            continue  # the same change on an amended parent: an earlier patch's amendment
        if path not in touched:
            key = blob_at(work, f"{amended}^", path)
        elif blob_at(work, f"{merged}^", path) == blob_at(work, f"{amended}^", path):
            key = blob_at(work, merged, path)
        else:
            key = ""
        if key and blob_at(work, amended, path):
            keys[path] = key
        else:
            skipped.append(path)
    return export_merge_edits(work, store, patch_name, keys, amended), skipped


