"""``bump --abort``: put back everything the backup holds, even when the journal is damaged."""

from tools.rebase.bump import journal as jr
from tools.rebase.bump.journal_records import CorruptJournal
from tools.rebase.bump.package_copy import restore_package
from tools.rebase.errors import RebaseError
from tools.rebase.git.owned import BACKUP_MARKER, BACKUP_PURPOSE, refuse_unmarked
from tools.rebase.stack.materialize import local_edits, materialize


class AbortPhase:
    """Mixin of ``Bump`` (uses ``layout``, ``work``, ``log``)."""

    def abort(self):
        layout = self.layout
        if not jr.in_progress(layout):
            raise RebaseError("no bump in progress (nothing to abort)")
        backup = jr.backup_dir(layout)
        if not backup.is_dir() or backup.is_symlink():
            # Only a backup the tool made says what to put back: a journal with none (carried by an
            # archive or a copy, or a version-1 journal that held its own manifest) restores nothing.
            raise RebaseError(f"{layout.rel(jr.journal_path(layout))}: a bump journal with no backup made "
                              f"here ({layout.rel(backup)} is missing), so it was not written by this "
                              f"checkout's bump; nothing was restored. Remove {layout.rel(jr.bump_dir(layout))} "
                              f"if no bump of yours is in progress")
        try:
            j = jr.load(layout)
        except CorruptJournal as exc:  # the backup alone is enough to restore
            j = None
            self.log(f"warning: {exc}")
        # The backup is copied over the checkout and the work repo's config: only one made here counts.
        refuse_unmarked(jr.backup_dir(layout), BACKUP_MARKER, BACKUP_PURPOSE, f"Nothing was restored from "
                        f"it; remove {layout.rel(jr.bump_dir(layout))} and restore upstream.toml and patches/ with git.")
        edited = jr.edited_during_bump(layout, j)
        if edited:
            shown = ", ".join(str(e) for e in edited[:8]) + (f" and {len(edited) - 8} more" if len(edited) > 8 else "")
            raise RebaseError(f"bump --abort would overwrite changes made since the bump started: {shown}. "
                              f"Copy them elsewhere and undo them here (git checkout / remove the new "
                              f"files), then run bump --abort again; nothing was restored")
        jr.restore(layout)
        if (j is None or j.materialized) and not restore_package(layout, self.log):
            self._rematerialize()  # a backup made by an older version of the tool holds no copy
        jr.finish(layout)
        self.log(f"bump onto {j.onto if j else '(unknown: journal unreadable)'} aborted: "
                 f"pin, patches/, report and work repo restored")

    def _rematerialize(self):
        """Put back the megatron/ of the restored stack (the tests may have rewritten it); edits
        made by hand since then are kept (the bump refused to start over edits)."""
        from tools.rebase.stack.state import read_state

        version = read_state(self.layout, tolerate_corrupt=True).get("version")
        if not version or not self.layout.package.is_dir() or not (self.work / "megatron").is_dir():
            return
        edits = local_edits(self.layout.package)
        if edits:
            self.log(f"warning: {self.layout.package} has edits made during the bump ({', '.join(edits[:5])}); "
                     f"left as is: `python -m tools.rebase apply --force` rebuilds it")
            return
        materialize(self.work, self.layout.package, version)
