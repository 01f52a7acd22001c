"""Where ``git rebase`` stopped: a recorded resolution is committed, an absorbed patch recorded,
or the bump stops at the conflict with its upstream causes (``analysis/conflicts.py``) and a
summary that tells the maintainer what to do."""

from tools.rebase.analysis import conflicts
from tools.rebase.analysis.lint import lint_worktree
from tools.rebase.bump import lend
from tools.rebase.bump.journal_records import StopInfo
from tools.rebase.bump import rerere_store as rr
from tools.rebase.bump import merge_edits as me
from tools.rebase.bump.commits import _commit_pick, _describe, _marker_files, _reset_to, _staged_changes, \
    _subject, _unmerged
from tools.rebase.bump.prepare import _base_label, _pin_from_toml
from tools.rebase.bump.stopped import Stopped
from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import git


def _resolve_hint(work, line_flag=""):
    return [f"Resolve in {work} (edit the files, then `git -C {work} add <files>`; do not commit),",
            f"then run `python -m tools.rebase bump{line_flag} --continue`. `bump --continue --drop` removes this",
            "patch on purpose; `bump --abort` restores the pin, patches/, report and work repo."]


class ConflictStop:
    """Mixin of ``Bump`` (uses ``work``, ``log``, ``hook``, ``j``, ``_save``, ``_record``,
    ``_record_recorded``, ``_absorbed_by``, ``_name_absorber`` and ``_lint_recorded``)."""

    def _stores(self):
        lender = self._lender()
        return [self.layout.resolutions] + ([lender.resolutions] if lender else [])

    def _refuse_foreign_resolution(self, idx, ids):
        """rerere matches a conflict by its text alone: a resolution filed under another patch's
        Patch-Name (a pull request can file one anywhere) must not resolve this patch's conflict."""
        name = self.j.names[idx]
        stores = self._stores()
        foreign = rr.foreign_ids(ids, self._edit_ids(name), stores)
        if foreign:
            shown = "; ".join(f"{rid} (recorded in {', '.join(where) or 'no resolutions folder'})"
                              for rid, where in sorted(foreign.items()))
            raise RebaseError(f"replaying {name}: its conflict was resolved by a recording that is not "
                              f"{name}'s own: {shown}. A recorded resolution applies to the patch it is "
                              f"filed under only; move it to resolutions/{name}/ if it is right, or remove "
                              f"it, then `bump --abort` and bump again")

    def _at_stop(self, idx, output):
        """``git rebase`` stopped at patch ``idx``: commit a recorded resolution, record an absorbed
        patch, or stop at the conflict with its upstream causes. ``output`` None: no conflict, a
        clean merge staged to be given its recorded edits (``_first_with_recorded_edits``)."""
        j = self.j
        work = self.work
        commit = j.commits[idx]
        unmerged = _unmerged(work)
        # Recorded edits of files that merged cleanly next to the conflict, or of a clean merge
        # amended at a test stop (merge_edits.py, amended_edits.py); only this patch's own.
        edits, applied = self._edits(idx), []
        self._say_out_of_scope(idx, me.paths_of_blobs(work, set(edits)), edits)
        edited = me.apply_merge_edits_chained(work, edits, self._edit_scope(idx), used=applied)
        if edited:
            self.log(f"  {j.names[idx]}: recorded edits of cleanly merged {', '.join(edited)} "
                     f"(from {', '.join(self._shown(e) for e in applied)})")
        if not unmerged and not _marker_files(work):
            # Nothing left to merge: rerere resolved every conflict from a recorded resolution
            # (or the result is empty: already in the new base).
            if _staged_changes(work):
                ids = rr.conflict_ids(work)
                reused = []
                if output is not None:  # a conflict stop: its pick was the stretch's last, rerere's reuses are its own
                    reused = sorted(set(ids) | set(rr.used_ids(work)))
                    self._refuse_foreign_resolution(idx, reused)
                which = rr.recording_folders(reused, j.names[idx], self._stores()) + applied  # before adopting lent ones
                j.picking = StopInfo(index=idx, files=[], rerere_ids=ids, upstream=[])
                self._save()  # a kill after the commit below must not pass it off as a clean replay
                new = _commit_pick(work, commit, j.dates[idx])
                self.hook("after-pick", index=idx)
                self._lint_recorded(idx, new)
                what = "clean merge edited" if output is None else "conflict resolved"
                origin = self._record_recorded(idx, new, clean=output is None)
                self.log(f"  {j.names[idx]}: {what} by a recorded resolution"
                         + (f" of {origin}" if origin else "")
                         + (f" ({', '.join(self._shown(f) for f in which)})" if which else ""))
            else:
                _reset_to(work, j.tip)
                up, how = self._name_absorber(idx, "empty after the recorded resolution")
                self._record(idx, "absorbed", upstream=up, how=how)
            return
        if not unmerged:
            _reset_to(work, j.tip)
            raise RebaseError(f"replaying {j.names[idx]} failed:\n{(output or '').strip()}")
        ids = rr.conflict_ids(work)
        absorbed = self._absorbed_by(idx)
        if absorbed:
            _reset_to(work, j.tip)
            self._record(idx, "absorbed", upstream=absorbed[0], how=absorbed[1])
            self.log(f"  {j.names[idx]}: absorbed upstream ({absorbed[1]})")
            return
        rr.enable(work)  # so a commit the maintainer makes while resolving is recorded too
        touching = self._upstream_touching(unmerged)
        analysis = self._analyse_conflict(idx, output, touching)
        analysis["lent"] = lend.candidates(self.lend_home, self.lend_home.line, work, j.names[idx], unmerged)
        merged = sorted(set(git("diff", "--cached", "--name-only", cwd=work).split()) - set(unmerged))
        # files that merged cleanly next to the conflict can be broken too
        findings = lint_worktree(work, merged, baselines=(j.new_base, commit))
        j.phase = "stopped"
        j.stopped = StopInfo(index=idx, files=unmerged, rerere_ids=ids, upstream=touching,
                                kind="conflict", analysis=analysis,
                                findings=[f.to_json() for f in findings],
                                merged=me.staged_blobs(work, merged))
        self._save()
        raise Stopped(self._conflict_summary())

    def _take_lent(self, label: str):
        """``--take-from LABEL``: stage that line's version of the stopped patch over every conflicted
        file (``lend.take`` refuses one that leaves a conflict); the continue records it."""
        j = self.j
        if j.phase != "stopped" or j.stopped is None or j.stopped.kind != "conflict":
            raise RebaseError("--take-from applies only while the bump is stopped at a conflicting patch")
        name = j.names[j.stopped.index]
        paths = lend.take(self.work, self.lend_home, self.lend_home.line, name, label)
        self.log(f"  {name}: took line {label}'s version of {', '.join(paths)}")

    def _upstream_touching(self, files):
        j = self.j
        old_pin, new_pin = _pin_from_toml(j.old_pin), _pin_from_toml(j.new_pin)
        if old_pin.kind == "git" and new_pin.kind == "git":
            out = git("log", "--no-merges", "--format=%H %s", f"{old_pin.commit}..{new_pin.commit}", "--",
                      *files, cwd=self.work)
            return [{"commit": line[:40], "subject": line[41:]} for line in out.splitlines()]
        out = git("diff", "--numstat", j.old_base, j.new_base, "--", *files, cwd=self.work)
        return [{"file": parts[2], "added": parts[0], "removed": parts[1]}
                for parts in (line.split("\t", 2) for line in out.splitlines())]

    def _analyse_conflict(self, idx, output, touching):
        j = self.j
        old_pin, new_pin = _pin_from_toml(j.old_pin), _pin_from_toml(j.new_pin)
        # From an sdist (no history) each file starts at its closest upstream version.
        upstream_range = (old_pin.commit if old_pin.kind == "git" else None, new_pin.commit) \
            if new_pin.kind == "git" else None
        return conflicts.analyse(
            self.work, output, upstream_range=upstream_range,
            candidates=touching if old_pin.kind == new_pin.kind == "git" else [], new_base=j.new_base, tip=j.tip,
            old_chain=(j.old_base, j.commits[idx - 1] if idx else j.old_base))

    def _conflict_summary(self) -> str:
        j = self.j
        s = j.stopped
        idx = s.index
        new_pin = _pin_from_toml(j.new_pin)
        if s.kind == "lint":
            return "\n".join([
                f"bump stopped: patch {idx + 1:04d}-{j.names[idx]} merged without a conflict, but the "
                f"result breaks Python files (post-merge lint):",
                *[f"  {f['message']}" for f in s.findings],
                f"The merged result is staged in {self.work}: fix the files, `git -C {self.work} add` them "
                f"(do not commit), then run `python -m tools.rebase bump{self.layout.line_flag} --continue`; `bump --continue "
                f"--drop` removes this patch on purpose; `bump --abort` restores everything."])
        if s.analysis:
            stack = {sha: f"{n}" for sha, n, _ in _describe(self.work, j.new_base, j.tip)} \
                if j.tip != j.new_base else {}
            dropped = {o.old: o.name for o in j.outcomes if o.outcome == "dropped"}
            return "\n".join([
                f"bump stopped: patch {idx + 1:04d}-{j.names[idx]} ({_subject(self.work, j.commits[idx])}) "
                f"conflicts with {_base_label(new_pin)} in:",
                *conflicts.summary_lines(s.analysis, stack, dropped),
                *(["upstream changes to these files between the bases:"]
                  + [f"  {u['file']} (+{u['added']}/-{u['removed']})" for u in s.upstream]
                  if s.upstream and "file" in s.upstream[0]
                  and not (s.analysis["causes"] or s.analysis["also"]) else []),
                *(["files that merged cleanly but break the post-merge lint:"]
                  + [f"  {f['message']}" for f in s.findings] if s.findings else []),
                *lend.summary_lines(s.analysis.get("lent", []), self.layout.line_flag),
                *_resolve_hint(self.work, self.layout.line_flag)])
        lines = [
            f"bump stopped: patch {idx + 1:04d}-{j.names[idx]} ({_subject(self.work, j.commits[idx])}) "
            f"conflicts with {_base_label(new_pin)} in:",
            *[f"  {f}" for f in s.files],
        ]
        if s.upstream and "commit" in s.upstream[0]:
            old_pin = _pin_from_toml(j.old_pin)
            lines.append(f"upstream commits in {old_pin.commit[:12]}..{new_pin.commit[:12]} touching these files:")
            lines += [f"  {u['commit'][:12]} {u['subject']}" for u in s.upstream]
        elif s.upstream:
            lines.append("upstream changes to these files between the bases:")
            lines += [f"  {u['file']} (+{u['added']}/-{u['removed']})" for u in s.upstream]
        else:
            lines.append("(no upstream commit between the bases touches these files)")
        return "\n".join(lines + _resolve_hint(self.work, self.layout.line_flag))
