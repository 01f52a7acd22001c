"""``megatron/`` as it was before a bump's tests rewrote it, kept in the bump's backup and put back
when the bump finishes or is aborted.

The tests of resolved patches run on the bumped tree, written over the checkout's ``megatron/``
(which an editable install serves). Left there, it would be a tree no ``apply`` built (stamped
``0+bump.testing``), and for a line other than the release line not even the release's package.
So the checkout keeps what its last ``apply`` built; ``apply`` alone chooses what ``megatron/``
holds. The copy lives in the backup folder the bump made (checked by its marker before anything
is read from it), is written once per bump, and restoring it is idempotent, so a bump killed and
continued at any point ends with the same tree.
"""

import os
import shutil
from pathlib import Path

from tools.rebase.bump.journal import _remove, backup_dir
from tools.rebase.git.owned import BACKUP_MARKER, BACKUP_PURPOSE, refuse_unmarked
from tools.rebase.stack.materialize import local_edits, swap_in
from tools.rebase.git.safefs import copy_entry, write_file

SAVED = "package"  # the copy of megatron/, in the backup folder
ABSENT = "package.absent"  # megatron/ did not exist before the bump


def _refuse_foreign_backup(layout) -> Path:
    backup = backup_dir(layout)
    refuse_unmarked(backup, BACKUP_MARKER, BACKUP_PURPOSE,
                    f"megatron/ was not touched; remove {layout.rel(backup)} and run "
                    f"`python -m tools.rebase apply{layout.line_flag} --force`.")
    return backup


def save_package(layout) -> None:
    """Copy ``megatron/`` into the backup before the tests overwrite it (symlinks are copied as
    links, never followed). Called while ``megatron/`` is still the pre-bump tree: a copy left by
    a run killed before the overwrite is replaced, since the tree is still the same."""
    backup = _refuse_foreign_backup(layout)
    live = layout.package
    for stale in (backup / SAVED, backup / (SAVED + ".tmp"), backup / ABSENT):
        _remove(stale)
    if not live.is_dir():
        write_file(backup, backup / ABSENT, "megatron/ did not exist before the bump\n")
        return
    staging = backup / (SAVED + ".tmp")
    copy_entry(backup, live, staging, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    os.replace(staging, backup / SAVED)


def restore_package(layout, log) -> bool:
    """Put the saved ``megatron/`` back; False when the backup holds no copy (a bump started by an
    older version of the tool), so the caller can fall back. Hand edits made to ``megatron/``
    since the tests wrote it are kept, with a warning."""
    backup = _refuse_foreign_backup(layout)
    saved, absent = backup / SAVED, backup / ABSENT
    if not (saved.is_dir() and not saved.is_symlink()) and not absent.is_file():
        return False
    live = layout.package
    edits = local_edits(live)
    if edits:
        log(f"warning: {layout.rel(live)} has edits made during the bump ({', '.join(edits[:5])}); left "
            f"as is: `python -m tools.rebase apply{layout.line_flag} --force` rebuilds it")
        return True
    staging = live.with_name(f"{live.name}.tmp-restore-{os.getpid()}")
    _remove(staging)  # a leftover, or a link a checkout carried: unlinked, never followed
    if absent.is_file():
        if live.is_dir():  # renamed first: a kill mid-delete leaves a .tmp-* leftover, not half a tree
            os.replace(live, staging)
            shutil.rmtree(staging)
        return True
    copy_entry(layout.root, saved, staging)
    swap_in(staging, live)
    return True
