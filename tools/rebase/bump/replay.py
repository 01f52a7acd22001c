"""Phase 2, the replay: one ``git rebase`` per stretch between stops, the commits it made adopted
as replayed patches (the ones it skipped are absorbed), recovery after a kill, and the outcome
records every phase writes into the journal."""

from tools.rebase.bump import rerere_store as rr
from tools.rebase.bump import merge_edits as me
from tools.rebase.stack.recordings import recorded_path
from tools.rebase.bump.journal_records import Outcome
from tools.rebase.bump.commits import _describe, _head, _patch_name, _read, _reset_to
from tools.rebase.bump.finish import _prefetch_finish
from tools.rebase.bump.lastbump import CLEAN_EDITED_NOTE, DROPPED_NOTE
from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import git, git_proc, rev_parse
from tools.rebase.stack.drops import drops_path, read_drops
from tools.rebase.stack.seed import files_of_patch, seeded_away_files


class ReplayPhase:
    """Mixin of ``Bump`` (uses ``work``, ``log``, ``hook``, ``j``, ``_save``; the lint gate's
    ``_lint_replayed``/``_lint_recorded``/``_stop_lint`` and ``_name_absorber``)."""

    def _replay_stretch(self):
        """Replay the patches left with one ``git rebase``; record what it replayed. Return the
        index of the patch it stopped at (None: it replayed to the end) and its output."""
        j = self.j
        work = self.work
        # Replay everything left with one `git rebase` (3-way merges, rerere on, committer
        # date = author date so ids are reproducible); it stops at the first conflict.
        first = j.next
        upstream = j.commits[first - 1] if first else j.old_base
        rr.used_ids(work)  # forget earlier reuses and recordings: a stop names only this stretch's
        limit = self._next_recorded_drop(first)  # the stretch ends before a patch the line drops
        proc = git_proc(*rr.RERERE_CONFIG, "rebase", "-q", "--onto", j.tip, "--reapply-cherry-picks",
                        "--empty=drop", "--committer-date-is-author-date", "--no-autosquash",
                        "--no-update-refs", upstream, j.commits[limit - 1], cwd=work)
        self.hook("after-rebase", index=first)
        idx = None
        if (work / ".git" / "rebase-merge").is_dir():
            stopped = _read(work / ".git" / "REBASE_HEAD")
            idx = next((k for k in range(first, len(j.commits))
                        if stopped and j.commits[k].startswith(stopped)), None)
            git_proc("rebase", "--quit", cwd=work)
            if idx is None:
                _reset_to(work, _head(work))
                raise RebaseError(f"git rebase stopped without naming the patch:\n"
                                  f"{(proc.stdout + proc.stderr).strip()}")
        elif proc.returncode != 0:
            _reset_to(work, j.tip)
            raise RebaseError(f"replaying the patches failed:\n{(proc.stdout + proc.stderr).strip()}")
        head, end = _head(work), idx if idx is not None else limit
        edited = self._first_with_recorded_edits(head, end)
        if edited:  # taken like a recorded resolution: staged on its parent for _at_stop
            idx, commit, head = edited
            end = idx
        if idx is None and limit == len(j.commits):  # replayed to the end: the export and report
            _prefetch_finish(work, j, head)  # read head while lint runs
        broken = self._lint_replayed(head, end)
        if broken:  # a clean merge that broke a Python file stops like a conflict
            k, bad, parent, findings = broken
            self._adopt(parent, end=k)
            self._stop_lint(k, bad, parent, findings)
        self._adopt(head, end=end)
        if edited:
            _reset_to(work, commit)
            git("reset", "-q", "--soft", head, cwd=work)
            return idx, None
        return idx, proc.stdout + proc.stderr

    def _next_recorded_drop(self, first: int) -> int:
        """Index of the first patch after ``first`` the line records as dropped, else the count."""
        drops = self._recorded_drops()
        return next((k for k in range(first + 1, len(self.j.commits)) if self.j.names[k] in drops),
                    len(self.j.commits))

    def _recorded_drops(self) -> dict:
        if not hasattr(self, "_drops"):
            self._drops = read_drops(self.layout)
        return self._drops

    def _drop_recorded(self, idx: int) -> bool:
        """Drop patch ``idx`` if the line records it as dropped (``patches/dropped``): a refresh
        from the release line does not stop on it again."""
        reason = self._recorded_drops().get(self.j.names[idx])
        if reason is None:
            return False
        shown = self.layout.rel(drops_path(self.layout))
        self._record(idx, "dropped", note=f"{DROPPED_NOTE}; recorded in {shown}: {reason}")
        self.log(f"  {self.j.names[idx]}: dropped (recorded in {shown})")
        return True

    def _first_with_recorded_edits(self, head, end):
        """The first patch of ``tip..head`` that merged cleanly to a file a recorded edit of that
        patch starts from (a test stop's amendment, amended_edits.py): (index, commit, parent)."""
        for sha, _name, k in self._match_replayed(head, end):
            if k is None:
                return None
            edits = self._edits(k)
            blobs = me.paths_of_blobs(self.work, set(edits), tree=sha)
            self._say_out_of_scope(k, blobs, edits)
            if me.has_merge_edit(self.work, blobs, edits, self._edit_scope(k)):
                return k, sha, rev_parse(self.work, f"{sha}^")
        return None

    def _edit_ids(self, name: str) -> set:
        """Ids recorded for patch ``name`` in this line's resolutions and the lending line's."""
        return set(self._edit_entries(name))

    def _edit_entries(self, name: str) -> dict:
        lender = self._lender()
        return me.merge_edits([self.layout.resolutions] + ([lender.resolutions] if lender else []), name)

    def _edits(self, idx: int) -> dict:
        """``{id: entry folder}`` of the recorded edits of patch ``idx`` (its own folder only)."""
        return self._edit_entries(self.j.names[idx])

    def _edit_scope(self, idx: int) -> set:
        """The files a recorded edit of patch ``idx`` may change at its stop: those its replay
        changes; on a line refreshed by ``seed``, those the line's own version of the patch changed
        before the seed; with ``--resolutions-from``, those the lender's version changes (an edit
        recorded outside the release line's version of the patch: ``check`` holds each recording to
        its own line's patch)."""
        name = self.j.names[idx]
        lender = self._lender()
        return (set(me.changed_files(self.work, self.j.commits[idx])) | seeded_away_files(self.layout, name)
                | (files_of_patch(lender.patches, name) if lender else set()))

    def _shown(self, path) -> str:
        """``path`` relative to the checkout; a lender's folder outside a dry run's scratch copy whole."""
        try:
            return self.layout.rel(path)
        except ValueError:
            return str(path)

    def _say_out_of_scope(self, idx: int, blobs: dict, edits: dict) -> None:
        for entry, path in me.out_of_scope(self.work, blobs, edits, self._edit_scope(idx)):
            self.log(f"  warning: {self.j.names[idx]}: recorded edit {self._shown(entry)} not applied to "
                     f"{path}: its patch's replay does not change that file"
                     + (f" (it names {recorded_path(entry)})" if recorded_path(entry) else ""))

    def _lender(self):
        other = self.resolutions_from
        if other is None and self.j.resolutions_from:  # resumed by `bump --continue`
            other = self.layout.for_line(self.j.resolutions_from)
        return other

    def _recover_replay(self):
        """After a kill during replay: adopt the patches git already committed, drop a half-done one."""
        work, j = self.work, self.j
        if (work / ".git" / "rebase-merge").is_dir():
            git_proc("rebase", "--quit", cwd=work)
        head = git("rev-parse", "HEAD", cwd=work).strip()
        if j.picking is not None:  # killed while committing a patch rerere had resolved
            idx = j.picking.index
            if head != j.tip and rev_parse(work, f"{head}^") == j.tip and _patch_name(work, head) == j.names[idx]:
                self._lint_recorded(idx, head)  # killed before its lint ran: a broken result still stops
                self._record_recorded(idx, head)
                _reset_to(work, head)
                return
            j.picking = None  # not committed: it is replayed (and resolved) again
            self._save()
        if head != j.tip and not (j.next == 0 and head in (j.old_tip, j.old_head)):
            if git_proc("merge-base", "--is-ancestor", j.tip, head, cwd=work).returncode != 0:
                raise RebaseError(f"{work} HEAD ({head[:12]}) does not descend from the bump's tip "
                                  f"({j.tip[:12]}); run bump --abort")
            self._adopt(head, end=None)
        _reset_to(work, j.tip)

    def _adopt(self, head, end):
        """Record the commits ``tip..head`` (made by one ``git rebase``) as replayed patches.

        Patches the rebase skipped between them became empty: absorbed. ``end`` is the index the
        rebase stopped at (or ``len(commits)`` when it finished), so the skipped patches before it
        are absorbed too; ``None`` when it was interrupted (what follows is not decided yet)."""
        j = self.j
        pos = j.next
        skipped = []
        for sha, name, k in self._match_replayed(head, end if end is not None else len(j.commits)):
            if k is None:
                raise RebaseError(f"{self.work}: commit {sha[:12]} ({name}) is not one of the patches "
                                  f"being replayed; run bump --abort")
            skipped += range(pos, k)
            self._note(k, "clean", sha)
            pos = k + 1
        if end is not None:
            skipped += range(pos, end)
            pos = end
        for k in skipped:
            self._note(k, "absorbed", upstream="", how="empty after replay")
        j.outcomes.sort(key=lambda o: o.index)
        j.next = pos
        self._save()
        for k in skipped:  # naming the absorbing commit needs the outcome list to be saved first
            up, how = self._name_absorber(k, "empty after replay")
            for o in j.outcomes:
                if o.index == k:
                    o.upstream, o.how = up, how
            self.log(f"  {j.names[k]}: absorbed upstream ({how})")
        if skipped:
            self._save()

    def _match_replayed(self, head, limit):
        """``[(commit, Patch-Name, patch index)]`` of tip..head: each commit matched by name to the
        next patch from ``j.next`` below ``limit`` (the ones between were skipped); a commit that
        matches none gets index None and ends the list."""
        j = self.j
        out, k = [], j.next
        for sha, name, _ in (_describe(self.work, j.tip, head) if head != j.tip else []):
            while k < limit and j.names[k] != name:
                k += 1
            out.append((sha, name, k if k < limit else None))
            if k == limit:
                break
            k += 1
        return out

    def _note(self, idx, outcome, new_commit=None, upstream="", how="", note=""):
        j = self.j
        j.outcomes.append(Outcome(index=idx, name=j.names[idx], old=j.commits[idx], new=new_commit,
                                     outcome=outcome, upstream=upstream, how=how, note=note))
        if new_commit:
            j.tip = new_commit

    def _record(self, idx, outcome, new_commit=None, upstream="", how="", note=""):
        j = self.j
        self._note(idx, outcome, new_commit, upstream, how, note)
        j.next = idx + 1
        j.stopped = j.picking = None
        j.phase = "replaying"
        self._save()

    def _record_recorded(self, idx: int, new: str, clean: bool = False) -> str:
        """Record a pick rerere resolved (``clean``: a clean merge given its recorded edits); return
        where the resolution came from ("" for this line's own, "line NAME" for one reused with
        ``--resolutions-from``), kept in the outcome's ``how``."""
        name = self.j.names[idx]
        origin = self._adopt_lent(name)
        self._export_resolutions(name, self.j.picking.rerere_ids)
        self._record(idx, "resolved-recorded", new, how=origin,
                     note=CLEAN_EDITED_NOTE if clean else "conflict resolved by a recorded resolution")
        return origin

    def _adopt_lent(self, name: str) -> str:
        """Copy the lending line's resolutions of patch ``name`` that this line lacks into its own
        ``resolutions/`` (so its next bump needs no lender); "line NAME" when there were any. rerere
        forgets the ids of conflicts it resolved, so the lender's folder of the same Patch-Name is
        what says a resolution was lent."""
        other = self._lender()
        if other is None:
            return ""
        adopted = rr.adopt(other.resolutions, self.layout.resolutions, name)
        return f"line {other.line}" if adopted else ""

    def _export_resolutions(self, name: str, ids: list) -> None:
        """Store the resolutions rerere holds for ``ids`` under patches/resolutions/<name>/; say so
        when one could not be recorded (it will have to be resolved again on the next bump)."""
        missing = rr.export_resolutions(self.work, self.layout.resolutions, name, ids)
        if missing:
            self.log(f"  warning: {name}: rerere recorded no resolution for conflict(s) {', '.join(missing)}; "
                     f"the next bump will stop there again")
