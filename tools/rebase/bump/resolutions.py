"""Recorded conflict resolutions kept in the repo, next to the patches.

git rerere remembers a resolution by the text of the conflict, in ``.git/rr-cache/<id>/``; that
cache is local and expires. We keep a copy per patch in ``patches/resolutions/<Patch-Name>/<id>/``
(``preimage*``/``postimage*`` files, byte for byte) and load it into the work repo's rr-cache before
a bump, so the same conflict on any clone is resolved and staged without asking. Edits of
cleanly merged files share the shape (below); each edits only the one file it names, and only a
file its patch's replay changes at that stop (``stack/recordings.py``).

Size: over 400 lines because both kinds of recording, their import, export and scoping rules
are one format on disk; split by kind, a change of the format would span two modules.
"""

import os
import shutil
from pathlib import Path

from tools.rebase.git import names
from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import git, git_proc
from tools.rebase.git.safefs import copy_entry, read_nofollow, write_file
from tools.rebase.stack.recordings import PATH_FILE, recorded_path

RERERE_CONFIG = ("-c", "rerere.enabled=true", "-c", "rerere.autoupdate=true")


def rr_cache(work: Path) -> Path:
    return work / ".git" / "rr-cache"


def _images(entry: Path) -> list:
    return sorted(p for p in entry.iterdir() if p.is_file() and p.name.startswith(("preimage", "postimage")))


def _check_entry(patch_name: str, rid: str, where: str) -> None:
    """Both names become folders under patches/resolutions/ and .git/rr-cache/: refuse anything
    that is not a plain Patch-Name and a 40-hex rerere id."""
    names.patch_name(patch_name, where, field="resolution folder (Patch-Name)")
    if not names.RERERE_ID.match(rid):
        raise RebaseError(f"{where}: resolution id {rid!r} is not a 40-hex rerere id")


def _refuse_links(path: Path) -> None:
    if path.is_symlink():
        raise RebaseError(f"{path}: recorded resolutions must not be symlinks")


def import_resolutions(store: Path, work: Path, only=None) -> int:
    """Copy every recorded resolution in ``store`` (only the folders of the Patch-Names in ``only``,
    when given) into the work repo's rr-cache; return the count."""
    _refuse_links(store)
    if not store.is_dir():
        return 0
    cache = rr_cache(work)
    count = 0
    for patch_dir in sorted(p for p in store.iterdir() if p.is_dir() or p.is_symlink()):
        _refuse_links(patch_dir)
        if only is not None and patch_dir.name not in only:
            continue
        for entry in sorted(p for p in patch_dir.iterdir() if p.is_dir() or p.is_symlink()):
            _refuse_links(entry)
            _check_entry(patch_dir.name, entry.name, str(entry))
            for image in entry.iterdir():
                _refuse_links(image)
            target = cache / entry.name
            target.mkdir(parents=True, exist_ok=True)
            for image in _images(entry):
                if not (target / image.name).exists():
                    copy_entry(cache, image, target / image.name)
            unmark_used(target)
            count += 1
    return count


def adopt(lender: Path, store: Path, patch_name: str) -> list:
    """Copy ``lender/patch_name/<id>/`` entries that ``store`` lacks into ``store/patch_name/``
    (``bump --resolutions-from``); return the ids copied."""
    _refuse_links(lender)
    _refuse_links(store)
    source = lender / patch_name
    _refuse_links(source)
    if not source.is_dir():
        return []
    copied = []
    for entry in sorted(source.iterdir()):
        _refuse_links(entry)
        _check_entry(patch_name, entry.name, str(entry))
        target = store / patch_name / entry.name
        if target.exists():
            continue
        images = _images(entry) + [f for f in (entry / PATH_FILE,) if f.is_file() or f.is_symlink()]
        for image in images:
            _refuse_links(image)
        target.mkdir(parents=True)
        for image in images:
            copy_entry(store, image, target / image.name)
        copied.append(entry.name)
    return copied


def reset_cache(work: Path) -> None:
    """Empty the rr-cache (a bump keeps the old one in its backup), so a bump reuses only the
    resolutions exported to patches/resolutions/, never one a fresh clone would not have."""
    shutil.rmtree(rr_cache(work), ignore_errors=True)


def _split_id(rid: str):
    """MERGE_RR names a conflict ``<hash>`` or, when rerere keeps several resolutions for the same
    hash, ``<hash>.<variant>`` (files ``preimage.<variant>``/``postimage.<variant>``)."""
    name, _, variant = rid.partition(".")
    return name, ("." + variant if variant and variant != "0" else "")


def conflict_ids(work: Path) -> list:
    """The rerere ids of the conflicts of the merge now in progress (from ``.git/MERGE_RR``)."""
    merge_rr = work / ".git" / "MERGE_RR"
    if not merge_rr.is_file():
        return []
    ids = []
    for record in merge_rr.read_bytes().split(b"\0"):
        if b"\t" in record:
            ids.append(record.split(b"\t", 1)[0].decode())
    return sorted(set(ids))


def record(work: Path) -> None:
    """Let rerere store the postimage of the resolved files (before committing)."""
    git_proc(*RERERE_CONFIG, "rerere", cwd=work)


def export_resolutions(work: Path, store: Path, patch_name: str, ids: list) -> list:
    """Copy the resolutions of the conflicts ``ids`` (any variant) into ``store/patch_name/<hash>/``
    as ``preimage``/``postimage``; return the ids rerere holds no resolution for."""
    _refuse_links(store)
    missing = []
    for rid in ids:
        _check_entry(patch_name, rid, f"resolution of {patch_name!r}")
        name, suffix = _split_id(rid)
        entry = rr_cache(work) / name
        pre, post = entry / f"preimage{suffix}", entry / f"postimage{suffix}"
        if not (pre.is_file() and post.is_file()):
            missing.append(rid)
            continue
        target = store / patch_name / name
        target.mkdir(parents=True, exist_ok=True)
        for stale in _images(target):
            if stale.name not in ("preimage", "postimage"):
                stale.unlink()
        for source, dest in ((pre, target / "preimage"), (post, target / "postimage")):
            data = source.read_bytes()
            if not dest.is_file() or dest.read_bytes() != data:
                write_file(store, dest, data)
    return missing


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
    _refuse_links(store)
    written = []
    for path, blob in sorted(merged.items()):
        after = git_proc("rev-parse", "--verify", "-q", f"{commit}:{path}", cwd=work).stdout.strip()
        if not after or after == blob:
            continue  # deleted (not representable) or left as merged
        _check_entry(patch_name, blob, f"merge edit of {patch_name!r}")
        target = store / patch_name / blob
        target.mkdir(parents=True, exist_ok=True)
        for dest, data in ((target / "preimage", git("cat-file", "blob", blob, cwd=work, binary=True)),
                           (target / "postimage", git("cat-file", "blob", after, cwd=work, binary=True)),
                           (target / PATH_FILE, f"{path}\n".encode())):
            if not dest.is_file() or dest.read_bytes() != data:
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
        _refuse_links(store)
        folder = store / patch_name
        _refuse_links(folder)
        if folder.is_dir():
            for entry in sorted(folder.iterdir()):
                if names.RERERE_ID.match(entry.name) and entry.name not in found:
                    _refuse_links(entry)
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


_UNUSED = 1  # the mtime an imported postimage gets; rerere sets it to now when it reuses the entry


def unmark_used(entry: Path) -> None:
    post = entry / "postimage"
    if post.is_file() and not post.is_symlink():
        os.utime(post, (_UNUSED, _UNUSED))


def used_ids(work: Path) -> list:
    """The rr-cache entries rerere reused since they were imported or last asked about (it touches
    a postimage it applies), marked unused again: which recordings resolved the stop's conflicts."""
    used = []
    cache = rr_cache(work)
    for entry in sorted(cache.iterdir()) if cache.is_dir() else []:
        post = entry / "postimage"
        if post.is_file() and not post.is_symlink() and post.stat().st_mtime > _UNUSED:
            used.append(entry.name)
            unmark_used(entry)
    return used


def recording_folders(ids, patch_name: str, stores) -> list:
    """The folders ``<store>/<patch_name>/<id>`` holding the rerere recordings ``ids`` (the first
    store that has one: this line's before a lender's)."""
    out = []
    for rid in ids:
        name, _ = _split_id(rid)
        found = next((store / patch_name / name for store in stores if (store / patch_name / name).is_dir()), None)
        if found is not None and found not in out:
            out.append(found)
    return out


def foreign_ids(ids, own: set, stores) -> dict:
    """``{id: [folders holding it]}`` of the rerere ids in ``ids`` recorded for other patches only
    (not among ``own``, the ids recorded for the patch being replayed)."""
    out = {}
    for rid in ids:
        if rid in own:
            continue
        out[rid] = [str(folder / rid) for store in stores if store.is_dir()
                    for folder in sorted(store.iterdir()) if (folder / rid).is_dir()]
    return out


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
    return {path: blob for path in _changed(work, parent, commit) if path not in known
            and (blob := _blob_at(work, parent, path))}


def unrecordable_stop_edits(work: Path, parent: str, commit: str, merged, conflicted=()) -> list:
    """The paths a stop's resolution ``commit`` changes that no recorded edit can give back: a file
    in neither ``parent`` nor the patch's merge (``merged``: cleanly merged, ``conflicted``), so
    added by the resolution, or a cleanly merged file that the resolution deletes. A replay cannot
    key them by a blob, so the next bump would lose them."""
    known = set(merged) | set(conflicted)
    added = [path for path in _changed(work, parent, commit)
             if path not in known and _blob_at(work, commit, path) and not _blob_at(work, parent, path)]
    deleted = [path for path in sorted(merged) if not _blob_at(work, commit, path)]
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


# ---------------------------------------------------------------- edits made at a test stop
#
# At a test stop the maintainer amends patch commits in the work repo. A patch that merged cleanly
# merges the same way on the next bump, so its amendment is kept like a stop's edit of a cleanly
# merged file, keyed by the blob the replay will give the file at that patch: the merged blob when
# the patch changes the file and the file came to it unamended, the parent's blob when the patch
# leaves the file alone (upstream's refusal removed in a file the patch did not touch).


def _blob_at(work: Path, rev: str, path: str) -> str:
    return git_proc("rev-parse", "--verify", "-q", f"{rev}:{path}", cwd=work).stdout.strip()


def _own_lines(work: Path, commit: str, path: str) -> list:
    """The lines ``commit`` adds and removes in ``path`` (no positions: they move with its parent)."""
    out = git("diff", "-U0", "--no-color", "--no-ext-diff", f"{commit}^", commit, "--", path, cwd=work)
    return [line for line in out.splitlines()
            if line[:1] in ("+", "-") and not line.startswith(("+++ ", "--- "))]


def changed_files(work: Path, commit: str) -> list:
    """The paths ``commit`` changes against its parent."""
    return _changed(work, f"{commit}^", commit)


def _changed(work: Path, old: str, new: str) -> list:
    return [p for p in git("diff", "--no-renames", "--name-only", "-z", old, new, cwd=work).split("\0") if p]


def export_amended_edits(work: Path, store: Path, patch_name: str, merged: str, amended: str):
    """Store what amending ``merged`` (the commit the bump made for ``patch_name``) into ``amended``
    changed; return (ids written, paths that cannot be recorded: an added file, or a file both the
    patch and an earlier amendment changed, whose merged blob is not known before the replay)."""
    if merged == amended:
        return [], []
    touched = set(_changed(work, f"{merged}^", merged))
    keys, skipped = {}, []
    for path in _changed(work, merged, amended):
        if _own_lines(work, merged, path) == _own_lines(work, amended, path):
            continue  # the same change on an amended parent: an earlier patch's amendment
        if path not in touched:
            key = _blob_at(work, f"{amended}^", path)
        elif _blob_at(work, f"{merged}^", path) == _blob_at(work, f"{amended}^", path):
            key = _blob_at(work, merged, path)
        else:
            key = ""
        if key and _blob_at(work, amended, path):
            keys[path] = key
        else:
            skipped.append(path)
    return export_merge_edits(work, store, patch_name, keys, amended), skipped


def prune(store: Path, keep_names) -> None:
    """Drop the resolutions of patches that are no longer in the series."""
    _refuse_links(store)  # a link would make this delete folders outside the checkout
    if not store.is_dir():
        return
    patch_dirs = list(store.iterdir())
    for patch_dir in patch_dirs:
        _refuse_links(patch_dir)
    for patch_dir in patch_dirs:
        if patch_dir.is_dir() and patch_dir.name not in keep_names:
            shutil.rmtree(patch_dir)
    if not any(store.iterdir()):
        store.rmdir()


def forget_in_progress(work: Path) -> None:
    git_proc(*RERERE_CONFIG, "rerere", "clear", cwd=work)


def enable(work: Path) -> None:
    """Turn rerere on in the work repo itself, so a commit the maintainer makes there records too."""
    config = (work / ".git" / "config").read_text()
    if "[rerere]\n\tenabled = true\n\tautoupdate = true\n" in config:
        return
    git("config", "rerere.enabled", "true", cwd=work)
    git("config", "rerere.autoupdate", "true", cwd=work)
