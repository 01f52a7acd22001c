"""``bump``: move the patch stack onto a new upstream base.

The patch commits are replayed with 3-way merges by ``git rebase`` (one run per stretch between
stops; rerere on, with the resolutions recorded in ``patches/resolutions/`` loaded first; committer
date = author date, so commit ids are the ones ``apply`` builds from the exported patches). Per
patch the outcome is one of:

- clean: replayed without conflict;
- resolved (recorded): rerere resolved every conflict; the patch's ``Tests:`` are re-run;
- resolved (by hand): the bump stopped, the maintainer resolved and ran ``bump --continue``;
- absorbed: the change is already in the new base (empty after replay or after resolution, its
  reverse applies to the new tree, or an upstream commit between the bases carries the same
  patch-id); the upstream commit is named when there is history to search;
- dropped: the maintainer removed it on purpose (``bump --continue --drop`` at its conflict).

Progress lives in the journal (``journal.py``) and in the work repo's own commits, so a bump can be
continued or aborted after being killed at any point, even inside ``git rebase``. On success the
pin is updated, ``patches/`` exported, and the report regenerated; ``apply`` then materializes
``megatron/``.

Each phase lives in its own module of this package (``start``, ``replay``, ``absorbed``,
``lintgate``, ``conflict``, ``resume``, ``resolved_tests``, ``finish``, ``abort``) as a mixin of
``Bump``; ``Bump`` holds the state (layout, journal, hooks) and sequences the phases.
"""

from tools.rebase.bump import journal as jr
from tools.rebase.bump.abort import AbortPhase
from tools.rebase.bump.absorbed import AbsorbedBy
from tools.rebase.bump.conflict import ConflictStop
from tools.rebase.bump.finish import FinishPhase
from tools.rebase.bump.killpoints import env_hook
from tools.rebase.bump.lintgate import LintGate
from tools.rebase.bump.premise_gate import PremiseGate
from tools.rebase.bump.prepare import _pin_from_toml
from tools.rebase.bump.replay import ReplayPhase
from tools.rebase.bump.resolved_tests import ResolvedTests, pytest_runner
from tools.rebase.bump.resume import ContinuePhase
from tools.rebase.bump.start import StartPhase
from tools.rebase.bump.stopped import Stopped
from tools.rebase.errors import RebaseError
from tools.rebase.git.gitlocks import clear_stale_locks
from tools.rebase.git.lock import locked

__all__ = ["Bump", "Stopped", "bump", "bump_abort", "bump_continue", "pytest_runner"]


class Bump(StartPhase, PremiseGate, ReplayPhase, AbsorbedBy, LintGate, ConflictStop, ContinuePhase, ResolvedTests,
           FinishPhase, AbortPhase):
    """One bump: its state (layout, journal ``j``, log, test runner, kill-point hook) and the order
    of its phases; the phases themselves are the mixins."""

    def __init__(self, layout, log=print, test_runner=pytest_runner, hook=env_hook, run_tests=True,
                 resolutions_from=None, allow_downgrade=False, lend_home=None, allow_broken_premise=False,
                 jobs=None):
        self.layout = layout
        self.allow_downgrade = allow_downgrade  # onto an older or lower-versioned base: refused unless set
        self.resolutions_from = resolutions_from  # another line's Layout: its resolutions are reused too
        self.lend_home = lend_home or layout  # whose checkout's other lines lend their patch versions
        self.allow_broken_premise = allow_broken_premise  # a base that breaks the premise: refused unless set
        self.premise_broken = []
        self.work = layout.work
        self.log = log
        self.test_runner = test_runner
        self.hook = hook
        self.run_tests = run_tests  # False: --no-tests (kept in the journal for every --continue)
        self.jobs = jobs  # the finishing gate's parallel test runs (None: the journal's, else 1)
        self.j = None

    # -- journal helpers
    def _save(self):
        jr.save(self.layout, self.j)

    def resume(self, drop: bool = False, take_from: str = None):
        self.j = jr.load(self.layout)
        if not self.j:
            raise RebaseError("no bump in progress (nothing to continue)")
        work = self.work
        clear_stale_locks(work)
        phase = self.j.phase
        if drop and phase != "stopped":
            raise RebaseError("--drop applies only while the bump is stopped at a conflicting patch")
        self._options_from_journal()
        if take_from is not None:
            self._take_lent(take_from)  # the other line's files staged: continued as a resolution
        if self.j.new_base is None:  # killed while importing the new base: start that step again
            self._import_new_base(_pin_from_toml(self.j.new_pin))
        if phase == "stopped":
            self._continue_stopped(drop)
        elif phase == "replaying":
            self._recover_replay()
        elif phase == "tests-failed":
            self._continue_tests_failed()
        return self._run()

    def _options_from_journal(self):
        """``--continue`` takes the options the bump started with from the journal: ``--no-tests``
        given at the start (or at any ``--continue``) stays on, ``--jobs`` given again replaces
        the recorded count, and the ``--mirror`` of the new base's URL is used again."""
        j = self.j
        j.run_tests = j.run_tests and self.run_tests
        self.run_tests = j.run_tests
        j.jobs = self.jobs or j.jobs
        self.jobs = j.jobs
        if j.mirror:
            from tools.rebase.stack.gitsource import MIRRORS, use_mirror

            url = _pin_from_toml(j.new_pin).url
            if url not in MIRRORS:
                use_mirror(url, j.mirror)
        self._save()

    def _run(self):
        """Replay stretch after stretch until the end or a stop, then test and finish."""
        j = self.j
        while j.phase == "replaying" and j.next < len(j.commits):
            if self._drop_recorded(j.next):
                continue
            idx, output = self._replay_stretch()
            if idx is None:
                continue  # replayed to the end, or up to a patch the line records as dropped
            self._at_stop(idx, output)
        if j.phase == "replaying":
            j.phase = "testing"
            self._save()
        if j.phase == "testing":
            self._test_resolved()
        if j.phase == "finishing":
            return self._finish()
        return None


# ---------------------------------------------------------------- entry points

def bump(layout, spec: str, **kw):
    with locked(layout, "bump"):
        return Bump(layout, **kw).start(spec)


def bump_continue(layout, drop: bool = False, take_from: str = None, **kw):
    with locked(layout, "bump --continue"):
        return Bump(layout, **kw).resume(drop=drop, take_from=take_from)


def bump_abort(layout, **kw):
    with locked(layout, "bump --abort"):
        return Bump(layout, **kw).abort()
