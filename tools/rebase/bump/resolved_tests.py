"""Phase 3: re-run the ``Tests:`` of the patches whose conflicts were resolved, on the bumped
``megatron/``; a failure (or an environment that cannot run them) stops the bump."""

import contextlib
import os
import tempfile
from pathlib import Path

from tools.rebase.bump.commits import _describe, _tests_of
from tools.rebase.bump.package_copy import save_package
from tools.rebase.bump.prepare import _refuse_package_edits
from tools.rebase.bump.stopped import Stopped
from tools.rebase.git.gitcmd import git
from tools.rebase.proof.testrun import COULD_NOT_RUN
from tools.rebase.stack.materialize import materialize
from tools.rebase.git.safefs import write_file


def pytest_runner(layout, name: str, node_ids: list) -> dict:
    """Run a patch's node ids in one pytest process (``megatron/`` is the bumped tree); see
    ``testrun.run_pytest`` for the outcomes (a broken environment is "could not run", not "failed")."""
    from tools.rebase.proof.testrun import run_pytest

    from tools.rebase.proof.testids import invalid_test_id

    # A Tests: id comes from a patch file (untrusted): one that could be read as a pytest option
    # or points outside tests/ is refused, never run.
    refused = {n: f"refused: {invalid_test_id(n)}" for n in node_ids if invalid_test_id(n)}
    results = run_pytest(layout.root, [n for n in node_ids if n not in refused])
    results.update(refused)
    return results


TESTED_PIN_VARIABLE = "FORK_REBASE_TESTED_PIN"


@contextlib.contextmanager
def _tested_pin(pin_text: str):
    """Name the new base's pin in the environment while the tests run: the checkout's pin file is
    still the old one until the bump finishes (and a line's is not at the top), so a test that
    compares against pristine upstream (tests/unit_tests/upstream_oracle.py) reads this one."""
    old = os.environ.get(TESTED_PIN_VARIABLE)
    with tempfile.TemporaryDirectory(prefix="fork-tested-pin-") as tmp:
        pin = Path(tmp) / "upstream.toml"
        write_file(Path(tmp), pin, pin_text)
        os.environ[TESTED_PIN_VARIABLE] = str(pin)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(TESTED_PIN_VARIABLE, None)
            else:
                os.environ[TESTED_PIN_VARIABLE] = old


def _failures(name: str, outcome: dict) -> list:
    """What in one patch's test outcome stops the bump. A skipped test (a GPU-only test on a CPU
    machine) is no failure while another of the patch's tests passed; a patch whose tests were
    all skipped is unverified here, which stops the bump as "could not run" (the environment)."""
    if outcome and all(res == "skipped" for res in outcome.values()):
        return [f"{name}: every Tests: id was skipped: {COULD_NOT_RUN} here "
                f"({', '.join(sorted(outcome))})"]
    return [f"{name}: {node}: {res}" for node, res in sorted(outcome.items())
            if res not in ("passed", "skipped")]


class ResolvedTests:
    """Mixin of ``Bump`` (uses ``layout``, ``work``, ``test_runner``, ``run_tests``, ``hook``,
    ``j`` and ``_save``)."""

    def _test_resolved(self):
        j = self.j
        todo = [o for o in j.outcomes if o.outcome in ("resolved-recorded", "resolved-manual")]
        if not self.run_tests or not todo:
            j.phase = "finishing"
            self._save()
            return
        work = self.work
        if not j.materialized:
            _refuse_package_edits(self.layout, "the tests of the resolved patches would overwrite them; "
                                  "move them away (or `bump --continue --no-tests`)")
        git("checkout", "-q", "-f", "--detach", j.tip, cwd=work)
        if (work / "megatron").is_dir():
            if not j.materialized:
                save_package(self.layout)  # put back when the bump finishes or is aborted
            j.materialized = True
            self._save()
            materialize(work, self.layout.package, "0+bump.testing", force=True)
        failures, results = [], {}
        by_name = {n: c for c, n, _ in _describe(work, j.new_base, j.tip)}
        with _tested_pin(j.new_pin):
            for o in todo:
                commit = by_name.get(o.name)
                if not commit:
                    continue
                ids = _tests_of(work, commit)
                outcome = self.test_runner(self.layout, o.name, ids) if ids else {}
                results[o.name] = outcome
                failures += _failures(o.name, outcome)
        j.tests = results
        if failures and all(COULD_NOT_RUN in f for f in failures):
            j.phase = "tests-failed"
            self._save()
            raise Stopped("bump stopped: the tests of patches whose conflicts were resolved could not run "
                          "(the environment, not the patch):\n  " + "\n  ".join(failures)
                          + f"\nFix the environment and `bump{self.layout.line_flag} --continue`, or "
                            "`bump --continue --no-tests` to "
                            "accept the resolution unverified; `bump --abort` restores everything.")
        if failures:
            j.phase = "tests-failed"
            self._save()
            raise Stopped("bump stopped: tests of patches whose conflicts were resolved fail:\n  "
                          + "\n  ".join(failures)
                          + f"\nFix the patch in {work} (amend its commit), then "
                            f"`bump{self.layout.line_flag} --continue`; "
                            "`bump --continue --no-tests` accepts as is; `bump --abort` restores everything.")
        j.phase = "finishing"
        self._save()
        self.hook("after-tests")
