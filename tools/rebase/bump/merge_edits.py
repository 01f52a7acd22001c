"""Recorded edits of files that merged without a conflict next to a stop (a recording's second
kind, stored like rerere's in ``patches/resolutions/<Patch-Name>/<id>/``, ``rerere_store.py``).
Each edits only the one file it names, and only a file its patch's replay changes at that stop
(``stack/recordings.py``)."""

from pathlib import Path

from tools.rebase.bump.rerere_store import check_entry, refuse_links
from tools.rebase.errors import RebaseError
from tools.rebase.git import names
from tools.rebase.git.gitcmd import git, git_proc
from tools.rebase.git.safefs import holds_bytes, read_nofollow, write_file
from tools.rebase.stack.recordings import PATH_FILE, recorded_path

# ---------------------------------------------------------------- edits of cleanly merged files
#
# rerere replays only the hunks that conflicted. A stop's resolution can also need edits in files
# that merged without a conflict (upstream added the same field elsewhere: a clean merge defines it
# twice). Those are kept in the same shape, ``<Patch-Name>/<id>/preimage`` and ``postimage``, with
# the id the git blob id of the merged file: a replay that merges the file to exactly that blob
# gets the postimage (a preimage is byte-compared first). rerere never looks such an id up.


def staged_blobs(work: Path, paths) -> dict:
    """``{path: blob id}`` of the stage-0 index entries of ``paths`` (a deleted path has none)."""
    paths = list(paths)
    if not paths:
        return {}
    out = git("ls-files", "-s", "-z", "--", *paths, cwd=work, binary=True)
    blobs = {}
    for record in out.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        _mode, blob, stage = meta.decode().split()
        if stage == "0":
            blobs[path.decode()] = blob
    return blobs


def export_merge_edits(work: Path, store: Path, patch_name: str, merged: dict, commit: str) -> list:
    """Store how the maintainer changed files git had merged cleanly at the stop (``merged``:
    path -> merged blob) in ``commit``, each with the path it edits; return the ids written."""
    refuse_links(store)
    written = []
    for path, blob in sorted(merged.items()):
        after = git_proc("rev-parse", "--verify", "-q", f"{commit}:{path}", cwd=work).stdout.strip()
        if not after or after == blob:
            continue  # deleted (not representable) or left as merged
        check_entry(patch_name, blob, f"merge edit of {patch_name!r}")
        target = store / patch_name / blob
        target.mkdir(parents=True, exist_ok=True)
        for dest, data in ((target / "preimage", git("cat-file", "blob", blob, cwd=work, binary=True)),
                           (target / "postimage", git("cat-file", "blob", after, cwd=work, binary=True)),
                           (target / PATH_FILE, f"{path}\n".encode())):
            if not holds_bytes(dest, data):
                write_file(store, dest, data)
        written.append(blob)
    return written


def edit_ids(stores, patch_name: str) -> set:
    """The ids recorded under ``<store>/<patch_name>/`` of each store (this line's, a lender's):
    the merged blobs a replay of that patch may edit (rerere ids among them never match a blob)."""
    return set(merge_edits(stores, patch_name))


def merge_edits(stores, patch_name: str) -> dict:
    """``{id: entry folder}`` of the recordings under ``<store>/<patch_name>/`` (this line's
    first, then a lender's): the only recordings a replay of ``patch_name`` reads its edits from."""
    found = {}
    for store in stores:
        refuse_links(store)
        folder = store / patch_name
        refuse_links(folder)
        if folder.is_dir():
            for entry in sorted(folder.iterdir()):
                if names.RERERE_ID.match(entry.name) and entry.name not in found:
                    refuse_links(entry)
                    found[entry.name] = entry
    return found


def paths_of_blobs(work: Path, ids, tree: str = None) -> dict:
    """``{path: blob}`` of the files of ``tree`` (default: the stage-0 index) whose blob is in ``ids``."""
    if not ids:
        return {}
    if tree:
        out = git("ls-tree", "-r", "-z", tree, cwd=work, binary=True)
    else:
        out = git("ls-files", "-s", "-z", cwd=work, binary=True)
    found = {}
    for record in out.split(b"\0"):
        meta, _, path = record.partition(b"\t")
        fields = meta.decode().split()
        if len(fields) != 3:
            continue
        # ls-tree: mode type blob; ls-files -s: mode blob stage (a conflicted path has no stage 0)
        blob = fields[2] if tree else fields[1] if fields[2] == "0" else ""
        if blob in ids:
            found[path.decode()] = blob
    return found



def _edit_of(work: Path, entry: Path, blob: str):
    """The postimage of the recorded edit ``entry`` when its preimage is the blob ``blob``, else None."""
    pre, post = entry / "preimage", entry / "postimage"
    if not (pre.is_file() and post.is_file()) or pre.is_symlink() or post.is_symlink():
        return None
    if read_nofollow(pre) != git("cat-file", "blob", blob, cwd=work, binary=True):
        return None
    return read_nofollow(post)


def edit_applies(path: str, entry: Path, scope) -> bool:
    """Whether the recorded edit ``entry`` may edit the staged file ``path``: only a file its
    patch's replay changes at that stop (``scope``), and only the one file it names."""
    named = recorded_path(entry)
    return path in scope and (named is None or named == path)


def has_merge_edit(work: Path, blobs: dict, edits: dict, scope) -> bool:
    """Whether a recorded edit of ``edits`` (id -> entry) starts from a file of ``blobs`` (path ->
    blob) it may edit."""
    return any(blob in edits and edit_applies(path, edits[blob], scope)
               and _edit_of(work, edits[blob], blob) is not None for path, blob in blobs.items())


def out_of_scope(work: Path, blobs: dict, edits: dict, scope) -> list:
    """``[(entry, path)]`` of the recorded edits that start from a file of ``blobs`` they may not
    edit (not changed by the patch's replay, or not the file they name): left out, said at the stop."""
    return [(edits[blob], path) for path, blob in sorted(blobs.items())
            if blob in edits and not edit_applies(path, edits[blob], scope)
            and _edit_of(work, edits[blob], blob) is not None]


def edits_outside_the_merge(work: Path, parent: str, commit: str, known) -> dict:
    """``{path: blob in parent}`` of the files ``commit`` changes that the merge at the stop left
    alone (not in ``known``: conflicted or merged): the replay gives them the parent's blob."""
    return {path: blob for path in changed_paths(work, parent, commit) if path not in known
            and (blob := blob_at(work, parent, path))}


def unrecordable_stop_edits(work: Path, parent: str, commit: str, merged, conflicted=()) -> list:
    """The paths a stop's resolution ``commit`` changes that no recorded edit can give back: a file
    in neither ``parent`` nor the patch's merge (``merged``: cleanly merged, ``conflicted``), so
    added by the resolution, or a cleanly merged file that the resolution deletes. A replay cannot
    key them by a blob, so the next bump would lose them."""
    known = set(merged) | set(conflicted)
    added = [path for path in changed_paths(work, parent, commit)
             if path not in known and blob_at(work, commit, path) and not blob_at(work, parent, path)]
    deleted = [path for path in sorted(merged) if not blob_at(work, commit, path)]
    return added + deleted


def apply_merge_edits(work: Path, blobs: dict, edits: dict, scope, used=None) -> list:
    """Give every staged file of ``blobs`` (path -> merged blob, from ``paths_of_blobs``) that a
    recording of ``edits`` (id -> entry folder of the patch's own) may edit its postimage, staged;
    return the paths changed (and add the entries applied to ``used``)."""
    changed = []
    for path, blob in sorted(blobs.items()):
        entry = edits.get(blob)
        if entry is None or not edit_applies(path, entry, scope):
            continue
        post = _edit_of(work, entry, blob)
        if post is None:
            continue
        target = work / path
        if target.is_symlink():
            raise RebaseError(f"{target}: a recorded merge edit must not write through a link")
        write_file(work, target, post)
        git("add", "--", path, cwd=work)
        changed.append(path)
        if used is not None and entry not in used:
            used.append(entry)
    return changed


def apply_merge_edits_chained(work: Path, edits: dict, scope, rounds: int = 8, used=None) -> list:
    """``apply_merge_edits`` until no recorded edit starts from a staged file: an edit recorded at
    a stop starts from the merged file as an earlier edit left it (a lent line's, say), so a replay
    needs both, in order. Bounded, so edits that lead back to their start cannot loop forever."""
    edited = []
    for _ in range(rounds):
        step = apply_merge_edits(work, paths_of_blobs(work, set(edits)), edits, scope, used)
        if not step:
            break
        edited += [path for path in step if path not in edited]
    return edited


def blob_at(work: Path, rev: str, path: str) -> str:
    return git_proc("rev-parse", "--verify", "-q", f"{rev}:{path}", cwd=work).stdout.strip()


def changed_files(work: Path, commit: str) -> list:
    """The paths ``commit`` changes against its parent."""
    return changed_paths(work, f"{commit}^", commit)


def changed_paths(work: Path, old: str, new: str) -> list:
    return [p for p in git("diff", "--no-renames", "--name-only", "-z", old, new, cwd=work).split("\0") if p]


