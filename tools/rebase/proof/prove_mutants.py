"""``prove --mutants N``: do a patch's ``Tests:`` pin what its added lines do?

For each selected patch the stack is built up to and including it in a scratch repository (as
``prove`` does), ``N`` seeded mutants of its added lines are made (:mod:`tools.rebase.proof.mutants`),
and for each one the patch's tests run on the tree with that one line changed. A mutant is
killed when a test fails, survived when they all pass, not run when they all skip (GPU-only
here) or cannot run. A survivor listed in ``patches/mutants-equivalent.toml`` with a reason is
counted as equivalent, not as a survivor. ``--record`` stores the scores under ``"mutants"`` in
``patches/proof.json`` with the stack digest; ``check`` flags them when the stack changed.
"""

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.stack.materialize import materialize, upstream_version
from tools.rebase.proof.mutants import (
    apply_mutant,
    in_code,
    load_equivalents,
    mutants_of_patch,
    sample,
    score,
)
from tools.rebase.proof.prove import (
    _build_without,
    proof_path,
    run_tests,
    scratch_stack,
    select,
    stack_digest_now,
)
from tools.rebase.stack.series import load_stack
from tools.rebase.proof.testids import missing_test

EQUIVALENTS_FILE = "mutants-equivalent.toml"


@dataclass
class MutantScore:
    name: str
    killed: int = 0
    survivors: list = field(default_factory=list)  # "path:line: original -> mutated (operator) [id]"
    equivalent: list = field(default_factory=list)  # "id: reason"
    not_run: int = 0
    invalid: int = 0  # mutants that do not compile (not counted)
    note: str = ""

    @property
    def score(self) -> float:
        return score(self.killed, len(self.survivors))


def _equivalents(layout) -> dict:
    path = layout.patches / EQUIVALENTS_FILE
    return load_equivalents(path.read_text(), f"patches/{EQUIVALENTS_FILE}") if path.is_file() else {}


def _outcome(outcomes: dict) -> str:
    values = list(outcomes.values())
    if any(v == "failed" for v in values):
        return "killed"
    if values and all(v == "passed" or v == "skipped" for v in values) and "passed" in values:
        return "survived"
    return "not run"


def mutate(layout, wanted=None, count=10, seed=0, log=print, runner=None) -> list:
    """Score the selected patches; one :class:`MutantScore` per patch, in series order."""
    runner = runner or run_tests
    _, patches = load_stack(layout)
    chosen = select(patches, wanted)
    equivalents = _equivalents(layout)
    scores = []
    with scratch_stack(layout, patches, "fork-mutants-") as (repo, _, commits, run):
        for index in chosen:
            patch = patches[index]
            result = MutantScore(patch.name)
            _build_without(repo, commits[index], [])  # the stack up to and including the patch
            version = f"{upstream_version(repo / 'megatron/core/package_info.py')}+rl.mutants.{index + 1:04d}"
            materialize(repo, run / "megatron", version, force=True)
            tests = [t for t in patch.tests if missing_test(run, t) is None]
            baseline = _outcome(runner(run, tests)) if tests else "not run"
            if baseline != "survived":
                result.note = "its Tests: do not pass on the patch itself" if baseline == "killed" \
                    else "its Tests: do not run here (GPU-only or missing)"
                scores.append(result)
                log(f"mutants: {index + 1:04d} {patch.name}: skipped, {result.note}")
                continue
            candidates = mutants_of_patch(patch.path.read_text(errors="replace"))
            texts = {p: (run / p).read_text() for p in {m.path for m in candidates} if (run / p).is_file()}
            for mutant in sample(in_code(candidates, texts), count, seed):
                target = run / mutant.path
                original = target.read_text()
                mutated = apply_mutant(original, mutant)
                try:  # a line inside a multi-line construct can give a file that does not parse
                    compile(mutated, str(target), "exec")
                except SyntaxError:
                    result.invalid += 1
                    continue
                target.write_text(mutated)
                try:
                    outcome = _outcome(runner(run, tests))
                except RebaseError:  # pytest could not even report: the tree does not import
                    outcome = "killed"
                finally:
                    target.write_text(original)
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
            log(f"mutants: {index + 1:04d} {patch.name}: {result.killed} killed, "
                f"{len(result.survivors)} survived, {len(result.equivalent)} equivalent")
            scores.append(result)
    return scores


def table(scores: list) -> str:
    rows = ["| patch | killed | survived | equivalent | not run | score |", "|---|---|---|---|---|---|"]
    for s in scores:
        rows.append(f"| {s.name} | {s.killed} | {len(s.survivors)} | {len(s.equivalent)} | "
                    f"{s.not_run} | {s.score:.0%} |" + (f" {s.note}" if s.note else "")
                    + (f" ({s.invalid} mutants did not compile)" if s.invalid else ""))
    lines = [f"  survivor of {s.name}: {line}" for s in scores for line in s.survivors]
    return "\n".join(rows + lines) + "\n"


def write_mutant_record(layout, scores: list, count: int, seed: int, proved_digest: str) -> Path:
    """Store the scores under ``"mutants"`` in ``patches/proof.json`` (other keys kept; atomic)."""
    if stack_digest_now(layout) != proved_digest:
        raise RebaseError("patches/ or the pin changed while the mutants ran; nothing was recorded")
    path = proof_path(layout)
    data = json.loads(path.read_text()) if path.is_file() else {}
    previous = data.get("mutants", {})
    entries = previous.get("patches", {}) if previous.get("stack_digest") == proved_digest else {}
    for s in scores:
        entries[s.name] = {**asdict(s), "score": s.score, "count": count, "seed": seed}
    data["mutants"] = {"stack_digest": proved_digest, "patches": entries}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def mutant_record_problem(layout):
    """Why the recorded mutant scores do not describe this stack, or None (also when none)."""
    path = proof_path(layout)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text()).get("mutants")
    except (ValueError, AttributeError) as exc:
        return f"patches/proof.json: not a proof record ({exc})"
    if record is None:
        return None
    if not isinstance(record, dict) or record.get("stack_digest") != stack_digest_now(layout):
        return ("patches/proof.json: mutant scores recorded for another stack; run python -m "
                "tools.rebase prove --mutants N --record")
    return None
