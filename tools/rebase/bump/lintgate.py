"""The post-merge lint gate (``analysis/lint.py``): a clean merge, a recorded resolution or a
hand resolution that breaks a Python file stops the bump like a conflict."""

from tools.rebase.analysis.lint import first_broken, lint_change
from tools.rebase.bump.journal_records import StopInfo
from tools.rebase.bump import merge_edits as me
from tools.rebase.bump.commits import _reset_to
from tools.rebase.bump.stopped import Stopped
from tools.rebase.git.gitcmd import git


class LintGate:
    """Mixin of ``Bump`` (uses ``work``, ``j``, ``_save``, ``_match_replayed``,
    ``_upstream_touching`` and ``_conflict_summary``)."""

    def _lint(self, idx, parent, commit):
        return lint_change(self.work, parent, commit, baselines=(self.j.new_base, self.j.commits[idx]))

    def _lint_replayed(self, head, end):
        """First patch of ``tip..head`` whose merge broke a Python file: (index, commit, parent,
        findings), or None."""
        j = self.j
        if head == j.tip:
            return None
        # a commit that is none of ours is left out here: _adopt reports it
        index = {sha: k for sha, _, k in self._match_replayed(head, end) if k is not None}
        broken = first_broken(self.work, j.tip, head,
                              lambda sha: (j.new_base, j.commits[index[sha]]) if sha in index else ())
        if broken and broken[0] in index:
            return index[broken[0]], broken[0], broken[1], broken[2]
        return None

    def _lint_recorded(self, idx, new):
        """A pick rerere resolved from a recorded resolution is linted like a clean merge."""
        findings = self._lint(idx, self.j.tip, new)
        if findings:
            self._stop_lint(idx, new, self.j.tip, findings)

    def _stop_lint(self, idx, bad, parent, findings):
        """Stop at patch ``idx`` with its merged result staged on ``parent`` for the maintainer."""
        _reset_to(self.work, bad)
        git("reset", "-q", "--soft", parent, cwd=self.work)
        files = sorted({f.path for f in findings})
        j = self.j
        j.phase = "stopped"
        j.picking = None
        staged = git("diff", "--cached", "--name-only", cwd=self.work).split()
        j.stopped = StopInfo(index=idx, files=files, rerere_ids=[], upstream=self._upstream_touching(files),
                                kind="lint", findings=[f.to_json() for f in findings],
                                merged=me.staged_blobs(self.work, staged))
        self._save()
        raise Stopped(self._conflict_summary())

    def _lint_gate(self, idx, parent, commit, undo):
        """Refuse a resolution that breaks a Python file (``undo``: un-commit it, keep it staged)."""
        findings = self._lint(idx, parent, commit)
        if findings:
            if undo:
                git("reset", "-q", "--soft", parent, cwd=self.work)
            raise Stopped(f"{self.j.names[idx]}: the resolution breaks Python files (post-merge lint):\n"
                          + "\n".join(f"  {f}" for f in findings)
                          + "\nfix them and `git add` (do not commit), then `bump --continue` again")
