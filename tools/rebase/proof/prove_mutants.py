"""``prove --mutants N``: do a patch's ``Tests:`` pin what its added lines do?

For each selected patch the stack is built up to and including it in a scratch repository (as
``prove`` does), ``N`` seeded mutants of its added lines are made (:mod:`tools.rebase.proof.mutants`),
and for each one the patch's tests run on the tree with that one line changed. A mutant is
killed when a test fails, survived when they all pass, not run when they all skip (GPU-only
here) or cannot run. A survivor listed in ``patches/mutants-equivalent.toml`` with a reason is
counted as equivalent, not as a survivor. ``--record`` stores the scores under ``"mutants"`` in
``patches/proof.json`` with the stack digest; ``check`` flags them when the stack changed.
"""

import functools
import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.stack.materialize import materialize, upstream_version
from tools.rebase.proof.mutants import (
    apply_mutant,
    in_code,
    load_equivalents,
    mutants_of_patch,
    sample_where,
    score,
)
from tools.rebase.git.gitcmd import git_proc
from tools.rebase.proof.parallel import run_groups
from tools.rebase.proof.prove import (
    Slots,
    _build_without,
    run_tests,
    scratch_stack,
    select,
)
from tools.rebase.proof.record import proof_path, stack_digest_now
from tools.rebase.stack.series import load_stack
from tools.rebase.proof.testids import missing_test
from tools.rebase.git.safefs import read_nofollow, write_file

EQUIVALENTS_FILE = "mutants-equivalent.toml"


@dataclass
class MutantScore:
    name: str
    killed: int = 0
    survivors: list = field(default_factory=list)  # "path:line: original -> mutated (operator) [id]"
    equivalent: list = field(default_factory=list)  # "id: reason"
    not_run: int = 0  # mutants whose tests all skipped here (GPU-only) or could not run
    invalid: int = 0  # mutants drawn that did not compile (replaced by the next ones drawn)
    skipped_tests: int = 0  # Tests: ids that skip on this machine (GPU-only): they kill nothing here
    note: str = ""
    seconds: float = 0.0  # wall time of its runs (build and tests), summed over slots: for planning

    @property
    def score(self):
        """Killed share of the non-equivalent mutants run; None when none ran (GPU-only here)."""
        if self.killed + len(self.survivors) == 0 and self.note:
            return None
        return score(self.killed, len(self.survivors))


def _equivalents(layout) -> dict:
    path = layout.patches / EQUIVALENTS_FILE
    if not path.is_file() and not path.is_symlink():
        return {}
    try:
        text = read_nofollow(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"patches/{EQUIVALENTS_FILE}: not UTF-8 ({exc})") from None
    return load_equivalents(text, f"patches/{EQUIVALENTS_FILE}")


def _outcome(outcomes: dict) -> str:
    """killed (a test failed), survived (none failed, at least one passed), else not run: a
    skipped test is never a kill."""
    values = list(outcomes.values())
    if any(v == "failed" for v in values):
        return "killed"
    if values and all(v == "passed" or v == "skipped" for v in values) and "passed" in values:
        return "survived"
    return "not run"


def _sampled(repo: Path, commit: str, patch, count: int, seed: int) -> tuple:
    """(``count`` mutants of ``patch`` sampled with ``seed``, number left out as not compiling),
    from the patched files at ``commit`` (read from git: no checkout needed). A mutant that does
    not compile (a line inside a multi-line construct) tests nothing, so the sample is drawn from
    the ones that do: ``count`` means ``count`` test runs."""
    candidates = mutants_of_patch(patch.path.read_text(errors="replace"))
    texts = {}
    for path in {m.path for m in candidates}:
        shown = git_proc("show", f"{commit}:{path}", cwd=repo)
        if shown.returncode == 0:
            texts[path] = shown.stdout

    def compiles(mutant):
        try:
            compile(apply_mutant(texts[mutant.path], mutant), mutant.path, "exec")
        except SyntaxError:
            return False
        return True

    return sample_where([m for m in in_code(candidates, texts) if m.path in texts], count, seed, compiles)


def _baseline_note(outcomes: dict) -> str:
    if not outcomes:
        return "its Tests: name no test found here"
    if all(v == "skipped" for v in outcomes.values()):
        return "GPU-only: every test of its Tests: skips here; run --mutants on the GPU machine"
    failed = [t for t, v in outcomes.items() if v == "failed"]
    if failed:
        return "its Tests: do not pass on the patch itself (" + ", ".join(failed) + ")"
    return "its Tests: do not run here (" + ", ".join(sorted(set(outcomes.values()))) + ")"


def mutate(layout, wanted=None, count=10, seed=0, log=print, runner=None, jobs=1) -> list:
    """Score the selected patches; one :class:`MutantScore` per patch, in series order.

    Each patch is a group: its baseline run (its tests on the patch itself), then one run per
    mutant, spread over ``jobs`` slots; the scores, and the lines logged, do not depend on
    ``jobs``."""
    # A mutant needs one failing test to be killed: its runs stop at the first failure.
    mutant_runner = runner or functools.partial(run_tests, first_failure=True)
    runner = runner or run_tests
    _, patches = load_stack(layout)
    chosen = select(patches, wanted)
    equivalents = _equivalents(layout)
    with scratch_stack(layout, patches, "fork-mutants-") as (repo, _, commits, run):
        slots = Slots(layout, repo, run)
        plans = [_sampled(repo, commits[index], patches[index], count, seed) for index in chosen]
        tests = [[t for t in patches[index].tests if missing_test(run, t) is None] for index in chosen]

        def build(slot, index):
            slot_repo, slot_run = slots.get(slot)
            if slots.built.get(slot) != index:
                _build_without(slot_repo, commits[index], [])  # the stack up to and including it
                version = (f"{upstream_version(slot_repo / 'megatron/core/package_info.py')}"
                           f"+rl.mutants.{index + 1:04d}")
                materialize(slot_repo, slot_run / "megatron", version, force=True)
                slots.built[slot] = index
            return slot_run

        def timed(slot, group, unit):
            began = time.monotonic()
            return work(slot, group, unit), time.monotonic() - began

        def work(slot, group, unit):
            index, mine = chosen[group], tests[group]
            if unit == 0:
                try:
                    return runner(build(slot, index), mine) if mine else {}
                except RebaseError as exc:  # one broken patch must not stop an unattended run
                    return {"(pytest)": f"could not run: {str(exc).splitlines()[0]}"}
            mutant = plans[group][0][unit - 1]
            slot_run = build(slot, index)
            target = slot_run / mutant.path
            original = target.read_text()
            write_file(slot_run, target, apply_mutant(original, mutant))
            try:
                return _outcome(mutant_runner(slot_run, mine))
            except RebaseError:  # pytest could not even report: the tree does not import
                return "killed"
            finally:
                write_file(slot_run, target, original)

        scores = []

        def report(group, results):
            index, (mutants, invalid) = chosen[group], plans[group]
            result = MutantScore(patches[index].name, invalid=invalid)
            result.seconds = round(sum(r[1] for r in results if r is not None), 1)
            baseline, results = results[0][0], [None] + [r[0] for r in results[1:] if r is not None]
            result.skipped_tests = sum(1 for v in baseline.values() if v == "skipped")
            if _outcome(baseline) != "survived":
                result.note = _baseline_note(baseline)
                log(f"mutants: {index + 1:04d} {result.name}: skipped, {result.note}")
                scores.append(result)
                return
            if not mutants:
                result.note = "no mutants: its added lines give none that compile"
            elif result.skipped_tests:
                result.note = f"{result.skipped_tests} of its Tests: skip here (GPU-only): not counted as kills"
            for mutant, outcome in zip(mutants, results[1:]):
                if outcome == "killed":
                    result.killed += 1
                elif outcome == "not run":
                    result.not_run += 1
                elif mutant.id in equivalents:
                    result.equivalent.append(f"{mutant.id}: {equivalents[mutant.id]}")
                else:
                    result.survivors.append(
                        f"{mutant.path}:{mutant.line}: {mutant.original.strip()} -> "
                        f"{mutant.mutated.strip()} ({mutant.operator}) [{mutant.id}]")
            log(f"mutants: {index + 1:04d} {result.name}: {result.killed} killed, "
                f"{len(result.survivors)} survived, {len(result.equivalent)} equivalent")
            scores.append(result)

        run_groups([1 + len(mutants) for mutants, _ in plans], timed, jobs,
                   go_on=lambda baseline: _outcome(baseline[0]) == "survived", on_group=report)
    return scores


def table(scores: list) -> str:
    rows = ["| patch | killed | survived | equivalent | not run | score |", "|---|---|---|---|---|---|"]
    for s in scores:
        shown = "n/a" if s.score is None else f"{s.score:.0%}"
        rows.append(f"| {s.name} | {s.killed} | {len(s.survivors)} | {len(s.equivalent)} | "
                    f"{s.not_run} | {shown} |" + (f" {s.note}" if s.note else "")
                    + (f" ({s.invalid} mutants drawn did not compile: others ran instead)" if s.invalid else ""))
    lines = [f"  survivor of {s.name}: {line}" for s in scores for line in s.survivors]
    return "\n".join(rows + lines) + "\n"


def prefix_digests(layout) -> dict:
    """Patch name -> digest of the pin and the series up to and including that patch."""
    from tools.rebase.stack.stack import stack_digest

    _, patches = load_stack(layout)
    pin, digests = layout.pin.read_bytes(), {}
    for end, patch in enumerate(patches, 1):
        names = "\n".join(p.name for p in patches[:end]).encode()
        digests[patch.name] = stack_digest(pin, names, [p.path.read_bytes() for p in patches[:end]])
    return digests


def write_mutant_record(layout, scores: list, count: int, seed: int, proved_digest: str) -> Path:
    """Store the scores under ``"mutants"`` in ``patches/proof.json`` (other keys kept; atomic);
    earlier entries stay while their prefix digest still matches the series."""
    if stack_digest_now(layout) != proved_digest:
        raise RebaseError("patches/ or the pin changed while the mutants ran; nothing was recorded")
    path = proof_path(layout)
    try:
        data = json.loads(read_nofollow(path).decode("utf-8")) if path.is_file() else {}
    except (ValueError, RecursionError) as exc:
        raise RebaseError(f"patches/proof.json: not a proof record ({exc.__class__.__name__}: {str(exc)[:200]}); "
                          f"nothing was recorded") from None
    prefixes = prefix_digests(layout)
    previous = data.get("mutants", {}).get("patches", {})
    entries = {name: entry for name, entry in previous.items()
               if isinstance(entry, dict) and entry.get("prefix_digest") == prefixes.get(name)}
    for s in scores:
        # The sample is drawn from the mutants that compile, which depends on the Python version
        # (3.12 parses f-strings 3.11 refuses), so the entry says which one drew it.
        entries[s.name] = {**asdict(s), "score": s.score, "count": count, "seed": seed,
                           "prefix_digest": prefixes[s.name], "python": platform.python_version()}
    data["mutants"] = {"patches": entries}
    write_file(layout.root, path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def mutant_record_findings(layout):
    """``(problem, stale)``: why the recorded mutant scores are malformed (a failure of ``check``),
    and which of them were scored on another stack up to their patch (a notice: the maintainer
    re-scores them at release or bump time). Each is None when there is nothing to say."""
    path = proof_path(layout)
    if not path.is_file():
        return None, None
    try:
        record = json.loads(read_nofollow(path).decode("utf-8")).get("mutants")
    except (ValueError, AttributeError, RecursionError) as exc:
        return f"patches/proof.json: not a proof record ({exc.__class__.__name__}: {str(exc)[:200]})", None
    if record is None:
        return None, None
    entries = record.get("patches") if isinstance(record, dict) else None
    if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
        return "patches/proof.json: the mutant record has no per-patch entries", None
    prefixes = prefix_digests(layout)
    stale = sorted(name for name, entry in entries.items() if entry.get("prefix_digest") != prefixes.get(name))
    if not stale:
        return None, None
    counts = {entries[name].get("count") for name in stale}
    count = counts.pop() if len(counts) == 1 and type(next(iter(counts))) is int else "N"
    gone = [name for name in stale if name not in prefixes]
    rescore = [name for name in stale if name in prefixes]
    command = (f"python -m tools.rebase prove --mutants {count} --record{layout.line_flag} {' '.join(rescore)}"
               if rescore else "")
    return None, (f"patches/proof.json: mutant scores of {', '.join(stale)} were recorded on another "
                  f"stack up to that patch" + (f" ({', '.join(gone)} no longer in the series)" if gone else "")
                  + (f"; re-score them with {command}" if command else
                     "; the next prove --mutants --record drops them"))
