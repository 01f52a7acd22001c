"""``bump --abort``: put back everything the backup holds, even when the journal is damaged."""

from tools.rebase.bump import journal as jr
from tools.rebase.errors import RebaseError
from tools.rebase.stack.materialize import local_edits, materialize


class AbortPhase:
    """Mixin of ``Bump`` (uses ``layout``, ``work``, ``log``)."""

    def abort(self):
        layout = self.layout
        if not jr.in_progress(layout):
            raise RebaseError("no bump in progress (nothing to abort)")
        try:
            j = jr.load(layout)
        except jr.CorruptJournal as exc:  # the backup alone is enough to restore
            j = None
            self.log(f"warning: {exc}")
        jr.restore(layout)
        if j is None or j.materialized:
            self._rematerialize()
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
