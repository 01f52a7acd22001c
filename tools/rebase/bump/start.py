"""Phase 1, ``bump --onto``: refuse over unsaved work, back everything up (the journal), import
the new base and load the recorded resolutions; then ``Bump._run`` replays."""

from dataclasses import replace

from tools.rebase.analysis.basecompare import downgrade_warnings
from tools.rebase.analysis.diffparse import prefetch_range
from tools.rebase.bump import journal as jr
from tools.rebase.bump.journal_records import Journal
from tools.rebase.bump import rerere_store as rr
from tools.rebase.bump.commits import _describe, _head, canonical_chain
from tools.rebase.bump.prepare import _ensure_applied, _refuse_unsaved_work, resolve_spec
from tools.rebase.errors import RebaseError
from tools.rebase.git.gitlocks import clear_stale_locks
from tools.rebase.stack.pin import load_pin
from tools.rebase.stack.source import import_base


def _mirror_of(pin) -> str:
    """The ``--mirror`` given for the new base's URL (kept for ``--continue``), else ""."""
    from tools.rebase.stack.gitsource import MIRRORS

    return MIRRORS.get(pin.url, "") if pin.kind == "git" else ""


class StartPhase:
    """Mixin of ``Bump`` (uses ``layout``, ``work``, ``log``, ``hook``, ``j``, ``_save``, ``_run``)."""

    def start(self, spec: str):
        layout = self.layout
        existing = jr.load(layout)
        if existing:
            raise RebaseError(
                f"a bump onto {existing.onto} is already in progress ({existing.phase}); "
                f"run `python -m tools.rebase bump --continue` or `bump --abort` first"
            )
        _refuse_unsaved_work(layout)
        if (self.work / ".git").is_dir():
            clear_stale_locks(self.work)  # left by a git killed with an earlier run
        old_pin = load_pin(layout.pin)
        new_pin = resolve_spec(layout, spec)
        if replace(new_pin, tree_sha256="") == replace(old_pin, tree_sha256=""):  # a check value, not the base
            raise RebaseError(f"the stack is already on {new_pin.display}; nothing to bump")
        _ensure_applied(layout)  # work repo == patches/ (refuses unexported work)
        work = self.work
        old_base = import_base(work, layout.cache, old_pin)
        # Hand-made commits (amended, am'd with a user identity) get reproducible twins, so the
        # report names the same old stack a fresh clone of patches/ would build; the maintainer's
        # branch itself stays where it was (abort must find it unchanged).
        old_head = _head(work)
        old_tip = canonical_chain(work, old_base, old_head)
        prefetch_range(work, old_base, old_tip)  # the report reads the old stack: start it now
        described = _describe(work, old_base, old_tip)
        commits = [c for c, _, _ in described]
        names = [n for _, n, _ in described]
        self.j = jr.begin(layout, Journal(
            onto=spec, phase="replaying", old_pin=old_pin.to_toml(), new_pin=new_pin.to_toml(),
            old_base=old_base, old_tip=old_tip, old_head=old_head, commits=commits, names=names,
            dates=[d for _, _, d in described],
            resolutions_from=self.resolutions_from.line if self.resolutions_from else "",
            run_tests=bool(self.run_tests), jobs=self.jobs or 1, mirror=_mirror_of(new_pin),
        ))
        self.hook("after-backup")
        loaded = self._import_new_base(new_pin)
        self.hook("after-import")
        backwards = downgrade_warnings(work, old_base, self.j.new_base, old_pin, new_pin)
        if backwards and not self.allow_downgrade:
            jr.restore(layout)  # as `bump --abort` does: the backup was made a moment ago
            jr.finish(layout)
            raise RebaseError(
                f"refusing to move the stack from {old_pin.display} onto {new_pin.display}: "
                f"{'; '.join(backwards)}. Nothing was changed. If that is meant (a line moved onto an "
                f"older dev or main commit, a release line back to an earlier release), pass "
                f"--allow-downgrade; `bump --dry-run` forecasts it without changing anything.")
        for warning in backwards:
            self.log(f"warning: {warning} (--allow-downgrade)")
        self._check_premise()
        # HEAD stays on the old tip: the first `git rebase` then checks out the new base only once.
        self.log(f"bump: {len(commits)} patches from {old_pin.display} onto {new_pin.display}"
                 + (f" ({loaded} recorded resolutions loaded)" if loaded else ""))
        return self._run()

    def _import_new_base(self, new_pin) -> int:
        """Import the new base and load patches/resolutions/ (and, with ``--resolutions-from``, that
        line's) into an rr-cache holding nothing else (the one from before the bump is in the
        backup), so only exported resolutions are reused."""
        new_base = import_base(self.work, self.layout.cache, new_pin)
        rr.reset_cache(self.work)
        loaded = rr.import_resolutions(self.layout.resolutions, self.work)
        if self.resolutions_from is not None:  # this line's own come first: rerere keeps the first copy
            # only the lender's folders of this stack's patches: its other recordings are not ours
            loaded += rr.import_resolutions(self.resolutions_from.resolutions, self.work, only=set(self.j.names))
        self.j.new_base = new_base
        self.j.tip = new_base
        self._save()
        return loaded
