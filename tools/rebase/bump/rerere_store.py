"""Recorded conflict resolutions kept in the repo, next to the patches: the rerere half.

git rerere remembers a resolution by the text of the conflict, in ``.git/rr-cache/<id>/``; that
cache is local and expires. We keep a copy per patch in ``patches/resolutions/<Patch-Name>/<id>/``
(``preimage*``/``postimage*`` files, byte for byte) and load it into the work repo's rr-cache before
a bump, so the same conflict on any clone is resolved and staged without asking. The same folders
hold the edits of cleanly merged files (``merge_edits.py``) and of test stops
(``amended_edits.py``); the entry checks and the pruning here are shared by all three.
"""

import os
import shutil
from pathlib import Path

from tools.rebase.git import names
from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import git, git_proc
from tools.rebase.git.safefs import copy_entry, holds_bytes, write_file
from tools.rebase.stack.recordings import PATH_FILE

RERERE_CONFIG = ("-c", "rerere.enabled=true", "-c", "rerere.autoupdate=true")


def rr_cache(work: Path) -> Path:
    return work / ".git" / "rr-cache"


def _images(entry: Path) -> list:
    return sorted(p for p in entry.iterdir() if p.is_file() and p.name.startswith(("preimage", "postimage")))


def check_entry(patch_name: str, rid: str, where: str) -> None:
    """Both names become folders under patches/resolutions/ and .git/rr-cache/: refuse anything
    that is not a plain Patch-Name and a 40-hex rerere id."""
    names.patch_name(patch_name, where, field="resolution folder (Patch-Name)")
    if not names.RERERE_ID.match(rid):
        raise RebaseError(f"{where}: resolution id {rid!r} is not a 40-hex rerere id")


def refuse_links(path: Path) -> None:
    if path.is_symlink():
        raise RebaseError(f"{path}: recorded resolutions must not be symlinks")


def import_resolutions(store: Path, work: Path, only=None) -> int:
    """Copy every recorded resolution in ``store`` (only the folders of the Patch-Names in ``only``,
    when given) into the work repo's rr-cache; return the count."""
    refuse_links(store)
    if not store.is_dir():
        return 0
    cache = rr_cache(work)
    count = 0
    for patch_dir in sorted(p for p in store.iterdir() if p.is_dir() or p.is_symlink()):
        refuse_links(patch_dir)
        if only is not None and patch_dir.name not in only:
            continue
        for entry in sorted(p for p in patch_dir.iterdir() if p.is_dir() or p.is_symlink()):
            refuse_links(entry)
            check_entry(patch_dir.name, entry.name, str(entry))
            for image in entry.iterdir():
                refuse_links(image)
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
    refuse_links(lender)
    refuse_links(store)
    source = lender / patch_name
    refuse_links(source)
    if not source.is_dir():
        return []
    copied = []
    for entry in sorted(source.iterdir()):
        refuse_links(entry)
        check_entry(patch_name, entry.name, str(entry))
        target = store / patch_name / entry.name
        if target.exists():
            continue
        images = _images(entry) + [f for f in (entry / PATH_FILE,) if f.is_file() or f.is_symlink()]
        for image in images:
            refuse_links(image)
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
    refuse_links(store)
    missing = []
    for rid in ids:
        check_entry(patch_name, rid, f"resolution of {patch_name!r}")
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
            if not holds_bytes(dest, data):
                write_file(store, dest, data)
    return missing



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


def prune(store: Path, keep_names) -> None:
    """Drop the resolutions of patches that are no longer in the series."""
    refuse_links(store)  # a link would make this delete folders outside the checkout
    if not store.is_dir():
        return
    patch_dirs = list(store.iterdir())
    for patch_dir in patch_dirs:
        refuse_links(patch_dir)
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
