"""``prove``: every patch is needed and right -- its ``Tests:`` fail on the stack built without
it and pass on the whole stack.

First the chosen patches' tests run once on the whole stack (``prove_with.py``: in parallel,
reusing cached results of an unchanged stack; a failing test is run on the pristine base too, to
say whether upstream or the stack broke it); a patch with a failing test is ``fails with it``.
Then, for each patch, the stack is rebuilt without it in a scratch repository that borrows the
work repo's objects read-only (git alternates), so nothing is re-imported. Later patches that no
longer apply without it are dropped too and named. The patch's tests then run in one pytest
process against that tree's ``megatron/``, copied next to the checkout's ``tests/``. The checkout
(work repo, ``megatron/``, ``patches/``, tool state) is never written, except ``patches/proof.json``
and the README's Proof column with ``--record``; scratch directories are removed at the end (also
on SIGTERM: the CLI turns it into an exit).

Size: about 400 lines, one job: the builds and the test runs of a proof share the scratch repo,
its slots and the run directories, which ``tree`` and ``prove --mutants`` reuse from here.
"""

import json
import re
import shutil
import sys
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import git, init_borrowing, rev_parse
from tools.rebase.stack.materialize import materialize, upstream_version
from tools.rebase.stack.pin import load_pin
from tools.rebase.stack.series import load_stack
from tools.rebase.stack.source import base_tag, import_base
from tools.rebase.stack.stack import am_one, select  # noqa: F401  (select: re-exported)
from tools.rebase.proof.isolation import isolated_env
from tools.rebase.proof.parallel import CHILDREN, run_groups
from tools.rebase.proof.failures import culprit
from tools.rebase.proof.prove_with import WithStack, run_with_stack
from tools.rebase.proof.record import FAILS_WITH, GPU_ONLY, PROVEN, UNPROVEN
from tools.rebase.proof.testcache import TestResults
from tools.rebase.proof.testids import invalid_test_id, missing_test
from tools.rebase.proof.testrun import is_under
from tools.rebase.git.safefs import copy_entry

# What the run directory needs from the checkout besides the scratch megatron/.
_RUN_COPIES = ("tests", "tools", "pytest.ini", "upstream.toml")
_PLUGIN = "_fork_prove_report"  # tools/rebase/proof/prove_report.py, copied into the run directory


@dataclass
class Proof:
    name: str
    tests: int = 0  # node ids named in Tests:
    failed: int = 0  # node ids that failed or errored on the stack without the patch
    skipped: int = 0  # node ids skipped there (GPU-only on a CPU machine)
    missing: list = field(default_factory=list)  # node ids pytest did not find
    passing: list = field(default_factory=list)  # node ids that pass without the patch (prove nothing)
    dropped: list = field(default_factory=list)  # later patches that need this one
    verdict: str = UNPROVEN
    failed_with: list = field(default_factory=list)  # node ids that fail on the whole stack
    with_notes: list = field(default_factory=list)  # why each fails: upstream's base or the stack

    @property
    def note(self) -> str:
        notes = list(self.with_notes)
        if self.dropped:
            notes.append("also dropped (need it): " + ", ".join(self.dropped))
        if self.missing:
            notes.append("not found: " + ", ".join(self.missing))
        if self.verdict == GPU_ONLY:
            notes.append("every test skipped here: prove it on the GPU run")
        return "; ".join(notes)


def verdict_for(outcomes: dict) -> tuple:
    """(verdict, failed, skipped, missing) from ``{node id: outcome}`` of the run without the patch."""
    failed = sum(1 for o in outcomes.values() if o == "failed")
    skipped = sum(1 for o in outcomes.values() if o == "skipped")
    missing = [n for n, o in outcomes.items() if o == "not found"]
    if failed:
        verdict = PROVEN
    elif missing:
        verdict = UNPROVEN
    elif outcomes and skipped == len(outcomes):
        verdict = GPU_ONLY
    else:
        verdict = UNPROVEN
    return verdict, failed, skipped, missing


def outcomes_for(node_ids: list, report: dict) -> dict:
    """Map each ``Tests:`` id (a directory, file, class or test) to failed / skipped / passed /
    not found from a plugin report."""
    out = {}
    for node in node_ids:
        # The node's file, or a file under a directory node, does not even import without the patch.
        if any(is_under(node, err) or ("::" not in err and is_under(err, node))
               for err in report.get("collect_errors", [])):
            out[node] = "failed"
            continue
        mine = [o for test, o in report.get("outcomes", {}).items() if is_under(test, node)]
        if not mine:
            out[node] = "not found"
        elif "failed" in mine:
            out[node] = "failed"
        elif all(o == "skipped" for o in mine):
            out[node] = "skipped"
        else:
            out[node] = "passed"
    return out


def _shim_dir(run: Path) -> Path:
    """Next to the run directory (not in it): the isolation ``sitecustomize`` (see isolation)."""
    return run.parent / "isolation"


def _pytest_once(run: Path, node_ids: list, first_failure: bool = False) -> dict:
    report_file = run / ".prove-report.json"
    report_file.unlink(missing_ok=True)
    env = isolated_env(run, _shim_dir(run), FORK_PROVE_REPORT=str(report_file))
    proc = CHILDREN.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", _PLUGIN,
         *(["--exitfirst"] if first_failure else []),
         "--continue-on-collection-errors", "--rootdir", str(run), "--", *node_ids],
        cwd=run, env=env,
    )
    if not report_file.is_file():
        raise RebaseError(f"pytest wrote no report (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-2000:]}")
    return json.loads(report_file.read_text())


def messages_for(node_ids: list, report: dict) -> dict:
    """``{node id: message}`` of the first failure under each ``Tests:`` id of a plugin report."""
    messages = report.get("messages", {})
    out = {}
    for node in node_ids:
        mine = [m for test, m in messages.items()
                if is_under(test, node) or ("::" not in test and is_under(node, test))]
        if mine:
            out[node] = mine[0]
    return out


def run_tests_detailed(run: Path, node_ids: list) -> dict:
    """``{node id: (outcome, message)}``: :func:`run_tests` with each failure's one-line message."""
    report = _run_report(run, node_ids)
    outcomes, messages = outcomes_for(node_ids, report), messages_for(node_ids, report)
    return {n: (o, messages.get(n, "") if o == "failed" else "") for n, o in outcomes.items()}


def run_tests(run: Path, node_ids: list, first_failure: bool = False) -> dict:
    """Run ``node_ids`` in one pytest process in ``run`` (whose megatron/ is the scratch stack).

    A node id inside a file that fails to import makes pytest stop before running anything, so
    the ids of the files that did import are run again on their own (one more process).
    ``first_failure`` (a mutant run: one failure decides) stops at the first failing test; the
    ids it never reached come back "not found".
    """
    return outcomes_for(node_ids, _run_report(run, node_ids, first_failure))


def _run_report(run: Path, node_ids: list, first_failure: bool = False) -> dict:
    # pytest loads a "-p NAME" plugin even after "--", so an id that is an option must never get here.
    unsafe = [n for n in node_ids if invalid_test_id(n)]
    if unsafe:
        raise RebaseError(f"prove: refusing Tests: id {unsafe[0]!r}: {invalid_test_id(unsafe[0])}")
    report = {"outcomes": {}, "collect_errors": [], "messages": {}}
    remaining = list(node_ids)
    while remaining:
        once = _pytest_once(run, remaining, first_failure)
        report["outcomes"].update(once["outcomes"])
        report["collect_errors"] += once["collect_errors"]
        for test, message in once.get("messages", {}).items():
            report["messages"].setdefault(test, message)
        if first_failure and (once["collect_errors"] or "failed" in once["outcomes"].values()):
            break
        left = [n for n in remaining
                if outcomes_for([n], report)[n] == "not found"]
        if not once["collect_errors"] or len(left) == len(remaining):
            break
        remaining = left
    return report


def _scratch_repo(layout, pin, tmp: Path) -> tuple:
    """A repo in ``tmp`` holding the pinned base; it reads the work repo's objects, never writes them."""
    repo = tmp / "tree"
    repo.mkdir()
    tag = base_tag(pin)
    base = None
    if init_borrowing(repo, layout.work):
        base = rev_parse(layout.work, f"refs/tags/{tag}")
    if base:
        git("tag", tag, base, cwd=repo)
    else:  # no work repo yet: import (and verify) the base into the scratch repo only
        base = import_base(repo, layout.cache, pin)
    git("checkout", "-q", "-f", "--detach", base, cwd=repo)
    return repo, base


def _prepare_run_dir(layout, run: Path) -> None:
    run.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in _RUN_COPIES:  # links are copied as links: an outside file is never copied in
        src = layout.pin if name == "upstream.toml" else layout.root / name  # a line's own pin
        if src.is_symlink():
            raise RebaseError(f"prove: {src} must not be a symlink; nothing was run")
        if src.is_dir() or src.is_file():
            copy_entry(run, src, run / name, ignore=ignore)
    copy_entry(run, Path(__file__).with_name("prove_report.py"), run / f"{_PLUGIN}.py")
    if layout.cache.is_dir():  # tests that need the pinned sdist (the upstream oracle) find it here
        (run / ".rebase").mkdir()
        (run / ".rebase" / "cache").symlink_to(layout.cache.resolve(), target_is_directory=True)


def _build_without(repo: Path, start: str, later: list, skip=frozenset()) -> tuple:
    """Check out ``start`` and apply ``later`` on it (but those named in ``skip``); return
    (kept names, dropped names)."""
    git("checkout", "-q", "-f", "--detach", start, cwd=repo)
    git("clean", "-q", "-fdx", cwd=repo)
    kept, dropped = [], []
    for patch in later:
        if patch.name in skip:
            dropped.append(patch.name)
            continue
        try:
            am_one(repo, patch.path.resolve(), three_way=True)
            kept.append(patch.name)
        except RebaseError:
            dropped.append(patch.name)
    return kept, dropped


_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/", re.M)
_FRAME = re.compile(r'^\s*(?:File "[^"]*?/)?(megatron/[^":]+\.py)"?(?:, line |:)\d+', re.M)


def _touched_files(patch) -> set:
    return set(_DIFF_HEADER.findall(patch.path.read_text(errors="replace")))


def _import_failure(run: Path):
    """The megatron file where ``import megatron.core`` fails in ``run`` (None when it imports).

    A later patch can apply cleanly without the one being proven and still import a module only
    that one adds; then nothing can be tested until that later patch is dropped too."""
    env = isolated_env(run, _shim_dir(run))
    proc = CHILDREN.run([sys.executable, "-c", "import megatron.core"], cwd=run, env=env)
    if proc.returncode == 0:
        return None
    frames = _FRAME.findall(proc.stderr)
    return frames[-1] if frames else "megatron (python -c 'import megatron.core' fails)"


def _build_importable(repo: Path, run: Path, start: str, later: list, version: str) -> list:
    """Build without the proven patch, then drop the later patches that keep the tree from
    importing (the ones touching the file where the import fails), until it imports; return the
    dropped names."""
    skip = set()
    while True:
        kept, dropped = _build_without(repo, start, later, frozenset(skip))
        materialize(repo, run / "megatron", version, force=True)
        broken = _import_failure(run)
        if broken is None:
            return dropped
        culprits = {p.name for p in later if p.name in kept and broken in _touched_files(p)}
        if not culprits:
            return dropped + [f"(megatron does not import: {broken})"]
        skip |= culprits


@contextmanager
def scratch_stack(layout, patches: list, prefix: str):
    """``(repo, base, commits, run)``: the whole stack replayed in a scratch repo (one commit per
    patch on the base) and a run directory with the checkout's tests; removed on exit. ``prove``
    and ``prove --mutants`` both start here."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        repo, base = _scratch_repo(layout, load_pin(layout.pin), tmp)
        commits = [am_one(repo, p.path.resolve(), three_way=True) for p in patches]
        run = tmp / "run"
        _prepare_run_dir(layout, run)
        yield repo, base, commits, run
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class Slots:
    """One ``(repo, run directory)`` per ``--jobs`` thread. Slot 0 is the scratch stack's own;
    slot ``i`` is made on its thread's first use next to it (a repo borrowing the scratch repo's
    objects, a run directory of its own), so parallel builds and test runs never share a file.
    ``built[i]`` names what slot ``i``'s ``megatron/`` holds now, so a thread rebuilds only when
    it moves to another patch."""

    def __init__(self, layout, repo: Path, run: Path):
        self._layout = layout
        self._made = {0: (repo, run)}
        self._lock = threading.Lock()
        self.built = {}

    def get(self, slot: int) -> tuple:
        with self._lock:
            if slot in self._made:
                return self._made[slot]
        home = self._made[0][0].parent / f"slot-{slot}"
        home.mkdir()
        repo = home / "tree"
        repo.mkdir()
        init_borrowing(repo, self._made[0][0])
        run = home / "run"
        _prepare_run_dir(self._layout, run)
        with self._lock:
            self._made[slot] = (repo, run)
        return repo, run


def _detailed(runner):
    """``run(run_dir, ids) -> {id: (outcome, message)}`` from a runner (a custom one gives no messages)."""
    if runner is run_tests:
        return run_tests_detailed
    return lambda run, ids: {n: (o, "") for n, o in runner(run, ids).items()}


def _with_whole_stack(layout, slots, repo, base, tip, node_ids, jobs, runner) -> WithStack:
    """The chosen patches' tests on the whole stack (see ``prove_with``)."""
    detailed = _detailed(runner)

    def on(slot, commit, label, ids):
        slot_repo, slot_run = slots.get(slot)
        git("checkout", "-q", "-f", "--detach", commit, cwd=slot_repo)
        git("clean", "-q", "-fdx", cwd=slot_repo)
        version = f"{upstream_version(slot_repo / 'megatron/core/package_info.py')}+rl.{label}"
        materialize(slot_repo, slot_run / "megatron", version, force=True)
        return detailed(slot_run, ids)

    tree = git("rev-parse", f"{tip}^{{tree}}", cwd=repo).strip()
    cache = TestResults(layout, tree, layout.pin.read_text()) if runner is run_tests else None
    return run_with_stack(cache, node_ids, jobs,
                          run_chunk=lambda slot, ids: on(slot, tip, "with", ids),
                          run_pristine=lambda ids: on(0, base, "pristine", ids),
                          find_culprit=lambda message: culprit(repo, message, _upstream_commit(layout)))


def _upstream_commit(layout) -> str:
    """The pinned upstream commit (its history is in the work repo), or "" for an sdist pin."""
    pin = load_pin(layout.pin)
    return pin.commit if pin.kind == "git" else ""


def _prove_one(repo: Path, run: Path, patches: list, index: int, start: str, runner) -> Proof:
    """The proof of ``patches[index]``, built without it (from ``start``) in ``repo``/``run``."""
    patch = patches[index]
    proof = Proof(patch.name, tests=len(patch.tests))
    git("checkout", "-q", "-f", "--detach", start, cwd=repo)  # a new slot's tree is still empty
    version = f"{upstream_version(repo / 'megatron/core/package_info.py')}+rl.without.{index + 1:04d}"
    proof.dropped = _build_importable(repo, run, start, patches[index + 1:], version)
    # A node id that names no test would abort the whole pytest run: report it instead.
    present = [t for t in patch.tests if missing_test(run, t) is None]
    outcomes = {t: "not found" for t in patch.tests if t not in present}
    if present:
        outcomes.update(runner(run, present))
    proof.verdict, proof.failed, proof.skipped, proof.missing = verdict_for(outcomes)
    proof.passing = [t for t in patch.tests if outcomes.get(t) == "passed"]
    return proof


def prove(layout, wanted=None, log=print, runner=None, jobs=1) -> list:
    """Prove the selected patches; return one :class:`Proof` per patch, in series order.

    ``jobs`` patches are proven at once, each in its own slot; the proofs, and the lines logged,
    are the same and in the same order whatever ``jobs`` is."""
    runner = runner or run_tests
    _, patches = load_stack(layout)
    chosen = select(patches, wanted)
    with scratch_stack(layout, patches, "fork-prove-") as (repo, base, commits, run):
        slots = Slots(layout, repo, run)
        present = list(dict.fromkeys(t for i in chosen for t in patches[i].tests if missing_test(run, t) is None))
        with_stack = _with_whole_stack(layout, slots, repo, base, commits[-1] if commits else base, present,
                                       jobs, runner)
        if with_stack.reused:
            log(f"prove: {with_stack.reused} of {len(present)} test result(s) on the whole stack reused "
                f"(same stack, tests and interpreter)")

        def work(slot, group, _unit):
            index = chosen[group]
            slot_repo, slot_run = slots.get(slot)
            proof = _prove_one(slot_repo, slot_run, patches, index, commits[index - 1] if index else base, runner)
            proof.failed_with = with_stack.failing(patches[index].tests)
            proof.with_notes = with_stack.notes(patches[index].tests)
            if proof.failed_with:
                proof.verdict = FAILS_WITH
            return proof

        def report(group, results):
            proof = results[0]
            log(f"prove: {chosen[group] + 1:04d} {proof.name}: {proof.verdict} "
                f"({proof.failed}/{proof.tests} failed without it, {len(proof.failed_with)} with it)"
                + (f"; {proof.note}" if proof.note else ""))

        results = run_groups([1] * len(chosen), work, jobs, on_group=report)
    return [r[0] for r in results]


def table(proofs: list) -> str:
    rows = ["| patch | tests run | failed without it | failed with it | verdict | note |",
            "|---|---|---|---|---|---|"]
    for p in proofs:
        rows.append(f"| {p.name} | {p.tests} | {p.failed} | {len(p.failed_with)} | {p.verdict} | {p.note} |")
    return "\n".join(rows) + "\n"
