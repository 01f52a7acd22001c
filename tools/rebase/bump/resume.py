"""``bump --continue`` at a stop: take the maintainer's resolution (staged or committed), or drop
the patch on purpose (``--drop``) and say which later patches and tests it leaves behind."""

from tools.rebase.analysis import dependents
from tools.rebase.bump import rerere_store as rr
from tools.rebase.bump import merge_edits as me
from tools.rebase.bump import amended_edits as ae
from tools.rebase.bump.commits import _commit_pick, _describe, _marker_files, _patch_name, _recommit, \
    _reset_to, _staged_changes, _tests_of, _unmerged
from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import git, is_clean, rev_parse
from tools.rebase.stack.drops import drops_path, record_drop


class ContinuePhase:
    """Mixin of ``Bump`` (uses ``work``, ``log``, ``hook``, ``j``, ``_record``,
    ``_export_resolutions``, ``_lint_gate`` and ``_name_absorber``)."""

    def _continue_stopped(self, drop: bool):
        j, work = self.j, self.work
        s = j.stopped
        idx = s.index
        name = j.names[idx]
        if drop:
            _reset_to(work, j.tip)
            note = self._drop_note(idx)
            self._record(idx, "dropped", note=note)
            self.log(f"  {name}: dropped ({note})")
            if record_drop(self.layout, name, f"dropped by the bump onto {self.j.onto}"):
                self.log(f"  {name}: recorded in {self.layout.rel(drops_path(self.layout))}: a later "
                         f"seed leaves it out (edit the reason there: why this line does not need it)")
            return
        head = git("rev-parse", "HEAD", cwd=work).strip()
        if head != j.tip:
            if rev_parse(work, f"{head}^") == j.tip and is_clean(work):
                # The maintainer committed the resolution: keep its tree (and its message when it
                # still names the patch), with the original author and a reproducible commit id.
                keep = _patch_name(work, head) == name
                self._lint_gate(idx, j.tip, head, undo=False)
                new = _recommit(work, head, j.tip, j.commits[idx], keep_message=keep)
                self._export_resolutions(name, s.rerere_ids)
                self._export_stop_edits(name, new)
                self._record(idx, "resolved-manual", new, note="conflict resolved by hand")
                return
            raise RebaseError(f"{work} HEAD moved to {head[:12]}; expected {j.tip[:12]} with the "
                              f"resolution of {name} staged (do not commit it yourself)")
        unmerged = _unmerged(work)
        if unmerged:
            raise RebaseError(f"{name}: still unmerged in {work}: {', '.join(unmerged)} "
                              f"(resolve, then `git -C {work} add` them)")
        markers = _marker_files(work)
        if markers:
            raise RebaseError(f"{name}: conflict markers left in {', '.join(markers)}")
        unstaged = git("diff", "--name-only", cwd=work).split()
        if unstaged:
            raise RebaseError(f"{name}: unstaged edits in {', '.join(unstaged)}; `git -C {work} add` them")
        rr.record(work)
        self.hook("after-record", index=idx)
        if _staged_changes(work):
            new = _commit_pick(work, j.commits[idx], j.dates[idx])
            self.hook("after-pick", index=idx)
            self._lint_gate(idx, j.tip, new, undo=True)
            self._export_resolutions(name, s.rerere_ids)
            self._export_stop_edits(name, new)
            self._record(idx, "resolved-manual", new, note="conflict resolved by hand")
        else:
            _reset_to(work, j.tip)
            up, how = self._name_absorber(idx, "empty after conflict resolution")
            self._record(idx, "absorbed", upstream=up, how=how)

    def _drop_note(self, idx):
        """Which later patches rest on the dropped one's lines, and which tests it orphans."""
        j = self.j
        gone = {o.index for o in j.outcomes if o.outcome in ("dropped", "absorbed")}
        deps = dependents.context_dependents(self.work, j.old_base, j.commits, idx)
        tests = {n: _tests_of(self.work, c) for k, (c, n) in enumerate(zip(j.commits, j.names))
                 if k not in gone}
        return dependents.drop_note(j.names, deps, dependents.orphaned_tests(tests, j.names[idx]))

    def _export_stop_edits(self, name, new):
        """Record the resolution's edits of files that merged cleanly at the stop, and of files the
        merge left alone (merge_edits.py), keyed by the blob each had before the edit."""
        s, work = self.j.stopped, self.work
        edits = me.edits_outside_the_merge(work, self.j.tip, new, set(s.merged) | set(s.files))
        me.export_merge_edits(work, self.layout.resolutions, name, {**edits, **s.merged}, new)
        lost = me.unrecordable_stop_edits(work, self.j.tip, new, s.merged, s.files)
        if lost:
            self.log(f"  warning: {name}: the resolution's {', '.join(lost)} cannot be recorded (a file "
                     f"the patch does not add, or a merged file deleted); the next bump will lose it: "
                     f"put the change in a file the patch adds or changes")

    def _continue_tests_failed(self):
        """After a test stop: take the amended patch commits (one per patch, as before) and record
        each amendment in resolutions/ (amended_edits.py), so the next bump replays it."""
        j, work = self.j, self.work
        head = git("rev-parse", "HEAD", cwd=work).strip()
        if not is_clean(work):
            raise RebaseError(f"{work} has uncommitted changes; commit (amend the patch) first")
        if head != j.tip:
            before, after = _describe(work, j.new_base, j.tip), _describe(work, j.new_base, head)
            if len(before) != len(after):
                raise RebaseError("the work repo must keep one commit per patch while fixing tests")
            for (merged, name, _), (amended, _, _) in zip(before, after):
                _, skipped = ae.export_amended_edits(work, self.layout.resolutions, name, merged, amended)
                if skipped:
                    self.log(f"  warning: {name}: the amendment of {', '.join(skipped)} cannot be recorded "
                             f"(a new file, or one an earlier patch's amendment changed too); the next "
                             f"bump will need it again")
            j.tip = head
        j.phase = "testing"
        self._save()
