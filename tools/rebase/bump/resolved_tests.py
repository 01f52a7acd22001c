"""Phase 3, the finishing gate: a bump finishes only when the bumped stack lints clean and every
patch's ``Tests:`` pass on it (the whole stack on the new base, written over ``megatron/``).

Why every patch, not only the resolved ones: a clean merge onto a broken base finished green once,
with 112 of the line's tests failing. A failing test is run again on the pristine new base
(``proof/failures.py``): when upstream broke it the stop says so and names the upstream commit
that last changed the name in the error; otherwise the stack (a resolution) broke it. The tests run
in ``--jobs`` pytest processes (each test file in one) and results of an unchanged stack are
reused (``proof/testcache.py``). A test runner given by a caller (the tests') is called once per
patch instead. ``--no-tests`` skips the tests, never the lint.
"""

import contextlib
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tools.rebase.analysis.lint import lint_stack
from tools.rebase.bump.commits import _describe, _tests_of
from tools.rebase.bump.package_copy import save_package
from tools.rebase.bump.prepare import _pin_from_toml, _refuse_package_edits
from tools.rebase.bump.stopped import Stopped
from tools.rebase.git.gitcmd import git, init_borrowing
from tools.rebase.proof.failures import STACK, UPSTREAM, classify, culprit, explain
from tools.rebase.proof.prove_with import chunks
from tools.rebase.proof.testcache import TestResults
from tools.rebase.proof.testrun import COULD_NOT_RUN
from tools.rebase.stack.materialize import materialize
from tools.rebase.git.safefs import write_file


def pytest_runner(layout, name: str, node_ids: list) -> dict:
    """Run a patch's node ids in one pytest process (``megatron/`` is the bumped tree); see
    ``testrun.run_pytest`` for the outcomes (a broken environment is "could not run", not "failed";
    a failure carries its message: ``failed: NameError: ...``)."""
    from tools.rebase.proof.testrun import run_pytest

    from tools.rebase.proof.testids import invalid_test_id

    # A Tests: id comes from a patch file (untrusted): one that could be read as a pytest option
    # or points outside tests/ is refused, never run.
    refused = {n: f"refused: {invalid_test_id(n)}" for n in node_ids if invalid_test_id(n)}
    messages = {}
    results = run_pytest(layout.root, [n for n in node_ids if n not in refused], messages)
    results = {n: f"failed: {messages[n]}" if o == "failed" and messages.get(n) else o for n, o in results.items()}
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


def _split(outcome: str) -> tuple:
    """``("failed", message)`` of a runner's ``failed: message`` outcome; others as they are."""
    if outcome.startswith("failed"):
        return "failed", outcome.partition(":")[2].strip()
    return outcome, ""


def run_gate_tests(layout, tree: str, pin_text: str, tests: dict, jobs: int, log) -> dict:
    """``{patch: {node id: outcome}}`` of ``tests`` (``{patch: [node ids]}``) against the
    checkout's ``megatron/`` (the stack whose tree is ``tree``): results cached for that tree
    first, the rest in ``jobs`` pytest processes, each test file in one of them."""
    cache = TestResults(layout, tree, pin_text)
    wanted = list(dict.fromkeys(t for ids in tests.values() for t in ids))
    found = {n: (o if o != "failed" or not m else f"failed: {m}") for n, (o, m) in cache.get(wanted).items()}
    todo = [t for t in wanted if t not in found]
    if found:
        log(f"  tests: {len(found)} of {len(wanted)} result(s) of this stack reused")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for part in pool.map(lambda ids: pytest_runner(layout, "", ids), chunks(todo, jobs) if todo else []):
            found.update(part)
    cache.put({n: _split(o) for n, o in found.items()})
    return {name: {t: found.get(t, "not found") for t in ids} for name, ids in tests.items()}


class _Root:
    def __init__(self, root):
        self.root = Path(root)


class ResolvedTests:
    """Mixin of ``Bump`` (uses ``layout``, ``work``, ``test_runner``, ``run_tests``, ``jobs``,
    ``hook``, ``log``, ``j`` and ``_save``)."""

    def _test_resolved(self):
        j = self.j
        self._lint_finished_stack()
        described = _describe(self.work, j.new_base, j.tip)
        tests = {name: ids for name, ids in ((n, _tests_of(self.work, c)) for c, n, _ in described) if ids}
        if not self.run_tests or not tests:
            j.phase = "finishing"
            self._save()
            return
        self._materialize_bumped()
        with _tested_pin(j.new_pin):
            results = self._run_gate(tests)
            j.tests = results
            failures = [f for name, outcome in results.items() for f in _failures(name, outcome)]
            if failures and all(COULD_NOT_RUN in f for f in failures):
                j.phase = "tests-failed"
                self._save()
                raise Stopped("bump stopped: the patches' tests could not run "
                              "(the environment, not the patch):\n  " + "\n  ".join(failures)
                              + f"\nFix the environment and `bump{self.layout.line_flag} --continue`, or "
                                "`bump --continue --no-tests` to "
                                "accept the stack unverified; `bump --abort` restores everything.")
            if failures:
                j.phase = "tests-failed"
                self._save()
                raise Stopped(self._failure_report(results, failures))
        j.phase = "finishing"
        self._save()
        self.hook("after-tests")

    def _lint_finished_stack(self):
        """The post-merge lint over every file the finished stack touches, as it is at the tip:
        a later patch can break a file only an earlier one touched."""
        j = self.j
        findings = lint_stack(self.work, j.new_base, j.tip, baselines=(j.new_base, j.old_tip))
        if findings:
            j.phase = "tests-failed"
            self._save()
            raise Stopped("bump stopped: the finished stack breaks Python files (post-merge lint; new "
                          "against the pristine new base and the old stack):\n"
                          + "\n".join(f"  {f}" for f in findings)
                          + f"\nFix the patch commits in {self.work} (amend them, one commit per patch), then "
                            f"`bump{self.layout.line_flag} --continue`; `bump --abort` restores everything.")

    def _materialize_bumped(self):
        j, work = self.j, self.work
        if not j.materialized:
            _refuse_package_edits(self.layout, "the tests of the bumped stack would overwrite them; "
                                  "move them away (or `bump --continue --no-tests`)")
        git("checkout", "-q", "-f", "--detach", j.tip, cwd=work)
        if (work / "megatron").is_dir():
            if not j.materialized:
                save_package(self.layout)  # put back when the bump finishes or is aborted
            j.materialized = True
            self._save()
            materialize(work, self.layout.package, "0+bump.testing", force=True)

    def _run_gate(self, tests: dict) -> dict:
        """``{patch: {node id: outcome}}`` on the bumped tree: cached results first, then the rest
        in ``jobs`` pytest processes (a caller's runner: once per patch, ``jobs`` at a time)."""
        jobs = self.jobs or 1
        if self.test_runner is not pytest_runner:
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                done = pool.map(lambda item: (item[0], self.test_runner(self.layout, *item)), tests.items())
                return dict(done)
        tree = git("rev-parse", f"{self.j.tip}^{{tree}}", cwd=self.work).strip()
        return run_gate_tests(self.layout, tree, self.j.new_pin, tests, jobs, self.log)

    def _failure_report(self, results: dict, failures: list) -> str:
        """The stop message: each failing test, upstream's fault (named) or the stack's."""
        failing = {t: _split(o) for outcome in results.values() for t, o in outcome.items()
                   if o.startswith("failed")}
        pristine = self._on_pristine_base(sorted(failing)) if failing else {}
        kinds = classify(failing, pristine)
        old_pin, new_pin = _pin_from_toml(self.j.old_pin), _pin_from_toml(self.j.new_pin)
        history = new_pin.kind == "git"
        oldest = old_pin.commit if history and old_pin.kind == "git" else ""
        lines = []
        for name, outcome in results.items():
            for t in sorted(t for t in outcome if t in failing):
                found = (culprit(self.work, failing[t][1], new_pin.commit, oldest)
                         if history and kinds.get(t) == UPSTREAM else None)
                lines.append(f"{name}: " + explain(t, failing[t][1] or "failed", kinds.get(t, STACK), found))
        other = [f for f in failures if ": failed" not in f]  # could not run, not found, refused
        upstream = [t for t in failing if kinds.get(t) == UPSTREAM]
        head = ("bump stopped: the new base itself breaks tests (they fail on the pristine new base too, "
                "with the same error): upstream's bug, not a resolution's" if upstream and len(upstream) == len(failing)
                else "bump stopped: the patches' tests fail on the bumped stack")
        advice = (f"\nFix it in a patch of {self.work} (amend the commit of the patch named), or bump onto "
                  f"another base; then `bump{self.layout.line_flag} --continue`; "
                  "`bump --continue --no-tests` accepts the stack as it is; `bump --abort` restores everything.")
        return head + ":\n  " + "\n  ".join(lines + other) + advice

    def _on_pristine_base(self, node_ids: list) -> dict:
        """``{node id: (outcome, message)}`` of ``node_ids`` on the new base with no patch, in a
        scratch tree next to a copy of the checkout's tests (``prove``'s run directory)."""
        from tools.rebase.proof.prove import _prepare_run_dir

        tmp = Path(tempfile.mkdtemp(prefix="fork-bump-pristine-"))
        try:
            repo = tmp / "tree"
            repo.mkdir()
            init_borrowing(repo, self.work)
            git("checkout", "-q", "-f", "--detach", self.j.new_base, cwd=repo)
            run = tmp / "run"
            _prepare_run_dir(self.layout, run)
            materialize(repo, run / "megatron", "0+bump.pristine", force=True)
            outcome = self.test_runner(_Root(run), "", node_ids)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return {n: _split(o) for n, o in outcome.items()}
