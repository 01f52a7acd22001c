"""``prove --mutants`` on a synthetic stack: killed and surviving mutants with their lines, an
equivalent recorded with a reason, the score stored in proof.json and flagged stale by check."""

import json

import pytest

from tests.tools.bumpkit import quiet, replace_line
from tests.tools.proof.test_prove import UPSTREAM, _fork_with_scratch
from tools.rebase.proof.check import check
from tools.rebase.cli import main
from tools.rebase.proof.mutants import mutants_of_patch
from tools.rebase.proof.prove_mutants import mutate

TEST = (
    "from megatron.core.alpha import clamp\n\n\n"
    "def test_clamps_above_ten():\n    assert clamp(12) == 10\n\n\n"
    "def test_keeps_small_values():\n    assert clamp(3) == 3\n"
)
CLAMP = "def value():\n    return 7\n\n\ndef clamp(x):\n    if x > 10:\n        return 10\n    return x\n"


@pytest.fixture
def fork(tmp_path, monkeypatch):
    fork = _fork_with_scratch(tmp_path, monkeypatch)
    (fork.root / "tests" / "test_alpha.py").write_text(TEST)
    fork.stack([
        ("alpha-clamp", {"megatron/core/alpha.py": CLAMP}, None, "Why.",
         "tests/test_alpha.py::test_clamps_above_ten tests/test_alpha.py::test_keeps_small_values"),
    ])
    return fork


def _patch_mutants(fork):
    (path,) = [p for p in fork.layout.patches.glob("*.patch")]
    return mutants_of_patch(path.read_text())


@pytest.mark.slow
def test_killed_survived_and_equivalent(fork):
    mutants = _patch_mutants(fork)
    by_line = {(m.original.strip(), m.mutated.strip()) for m in mutants}
    # "x > 10" -> "x >= 10" keeps both tests passing (10 clamps to 10 either way): a survivor.
    assert ("if x > 10:", "if x <= 10:") in by_line and ("if x > 10:", "if x > 11:") in by_line
    (score,) = mutate(fork.layout, count=len(mutants), log=quiet)
    assert score.killed + len(score.survivors) == len(mutants) and score.not_run == 0
    survivors = [s for s in score.survivors if "if x > 11:" in s]
    assert survivors and survivors[0].startswith("megatron/core/alpha.py:6: if x > 10: -> if x > 11:")
    assert not any("if x <= 10:" in s for s in score.survivors), "the flipped comparison is killed"
    # Recording the survivor as equivalent needs a reason; then it no longer counts.
    survivor_id = survivors[0].rsplit("[", 1)[1].rstrip("]")
    sidecar = fork.layout.patches / "mutants-equivalent.toml"
    sidecar.write_text(f'[[equivalent]]\nid = "{survivor_id}"\nreason = ""\n')
    with pytest.raises(ValueError, match="a reason is required"):
        mutate(fork.layout, count=len(mutants), log=quiet)
    sidecar.write_text(f'[[equivalent]]\nid = "{survivor_id}"\nreason = "no test input is 11"\n')
    (again,) = mutate(fork.layout, count=len(mutants), log=quiet)
    assert again.equivalent == [f"{survivor_id}: no test input is 11"]
    assert len(again.survivors) == len(score.survivors) - 1


def test_record_and_check_flags_it_stale(fork, capsys):
    code = main(["-C", str(fork.root), "prove", "--mutants", "3", "--seed", "1", "--record"])
    out = capsys.readouterr().out
    assert "| patch | killed | survived | equivalent | not run | score |" in out
    assert code == (1 if "survivor of alpha-clamp" in out else 0)
    record = json.loads((fork.layout.patches / "proof.json").read_text())["mutants"]
    entry = record["patches"]["alpha-clamp"]
    assert entry["count"] == 3 and entry["seed"] == 1 and entry["killed"] + len(entry["survivors"]) == 3
    import platform

    assert entry["python"] == platform.python_version()
    assert not any("mutant scores" in p for p in check(fork.layout, log=quiet))
    # A patch added after it leaves its score current: its mutants ran on the stack up to it.
    fork.add_patch("beta-more", {"megatron/core/beta.py": lambda t: t + "BETA_MORE = 1\n"})
    from tools.rebase.stack.workrepo import export

    export(fork.layout, log=quiet)
    assert not any("mutant scores" in p for p in check(fork.layout, log=quiet))
    # Recording the new patch keeps the earlier entry next to it.
    main(["-C", str(fork.root), "prove", "--mutants", "2", "--record", "beta-more"])
    capsys.readouterr()
    entries = json.loads((fork.layout.patches / "proof.json").read_text())["mutants"]["patches"]
    assert set(entries) == {"alpha-clamp", "beta-more"} and entries["alpha-clamp"] == entry
    # Changing a patch makes the scores of it and of the patches after it stale, named with the
    # command to rerun; the ones before it stay current.
    second, first = (next(fork.layout.patches.glob(f"000{n}-*.patch")) for n in (2, 1))
    second.write_text(second.read_text().replace("Subject: ", "Subject: reworded ", 1))

    def stale_notice(**kwargs):
        said = []
        problems = check(fork.layout, log=said.append, **kwargs)
        return problems, [line for line in said if "mutant scores" in line]

    problems, (notice,) = stale_notice()
    assert not any("mutant scores" in p for p in problems)
    assert notice.startswith("STALE: ") and "mutant scores of beta-more were recorded on another stack" in notice
    assert notice.endswith("re-score them with python -m tools.rebase prove --mutants 2 --record beta-more")
    first.write_text(first.read_text().replace("Subject: ", "Subject: reworded ", 1))
    problems, (notice,) = stale_notice()
    assert "mutant scores of alpha-clamp, beta-more were recorded on another stack" in notice
    # Their recorded counts differ (3 and 2): the command leaves N to the maintainer.
    assert notice.endswith("prove --mutants N --record alpha-clamp beta-more"), notice
    problems, notices = stale_notice(strict_records=True)
    assert not notices and any("mutant scores of alpha-clamp, beta-more" in p and "--strict-records" in p
                               for p in problems), problems
    # A malformed mutant record is a failure whatever the flag.
    record = json.loads((fork.layout.patches / "proof.json").read_text())
    record["mutants"]["patches"]["alpha-clamp"] = "forged"
    (fork.layout.patches / "proof.json").write_text(json.dumps(record))
    problems, _ = stale_notice()
    assert "patches/proof.json: the mutant record has no per-patch entries" in problems


def test_bad_count_is_refused(fork, capsys):
    assert main(["-C", str(fork.root), "prove", "--mutants", "0"]) != 0
    assert "--mutants needs a count >= 1, got 0" in capsys.readouterr().err


@pytest.mark.slow
def test_jobs_give_the_serial_scores_in_the_serial_order(fork):
    from dataclasses import asdict

    count = len(_patch_mutants(fork))
    serial_log, parallel_log = [], []
    serial = mutate(fork.layout, count=count, log=serial_log.append)
    parallel = mutate(fork.layout, count=count, log=parallel_log.append, jobs=4)
    def verdicts(scores):  # all but the timing
        return [{k: v for k, v in asdict(s).items() if k != "seconds"} for s in scores]

    assert verdicts(parallel) == verdicts(serial)
    assert serial[0].seconds > 0
    assert serial[0].killed and serial[0].survivors, "the comparison needs both outcomes"
    assert parallel_log == serial_log
    assert list(fork.scratch.iterdir()) == []


def test_skipped_tests_never_kill_and_a_gpu_only_patch_has_no_score(tmp_path, monkeypatch):
    fork = _fork_with_scratch(tmp_path, monkeypatch)
    (fork.root / "tests" / "test_alpha.py").write_text(TEST + (
        "\n\nimport pytest\n\n\n@pytest.mark.skip(reason='needs a CUDA device')\n"
        "def test_on_gpu():\n    assert clamp(99) == 10\n"))
    (fork.root / "tests" / "test_gpu.py").write_text(
        "import pytest\n\n\n@pytest.mark.skip(reason='needs a CUDA device')\n"
        "def test_gamma_on_gpu():\n    assert False\n")
    fork.stack([
        ("alpha-clamp", {"megatron/core/alpha.py": CLAMP}, None, "Why.",
         "tests/test_alpha.py::test_keeps_small_values tests/test_alpha.py::test_on_gpu"),
        ("gamma-gpu", {"megatron/core/gamma.py": "G = 1\nH = G + 1\n"}, None, "Why.", "tests/test_gpu.py"),
    ])
    mixed, gpu = mutate(fork.layout, count=20, log=quiet, jobs=2)
    # The mutants only the skipped test could kill ("return 10" deleted, "x > 10" -> "x > 11")
    # survive here: a skip is never a kill.
    assert mixed.skipped_tests == 1 and "1 of its Tests: skip here (GPU-only)" in mixed.note
    assert any("return 10 -> pass" in s for s in mixed.survivors)
    assert gpu.killed == 0 and gpu.survivors == [] and gpu.score is None
    assert gpu.note.startswith("GPU-only: every test of its Tests: skips here")
    from tools.rebase.proof.prove_mutants import table

    assert "| gamma-gpu | 0 | 0 | 0 | 0 | n/a | GPU-only" in table([mixed, gpu])


def test_tests_failing_on_the_patch_itself_are_named_and_the_run_goes_on(tmp_path, monkeypatch):
    # A Tests: id that needs a later patch fails on the stack up to this one: no mutant of it
    # means anything, so the patch is skipped with that id named, and the next patch still runs.
    fork = _fork_with_scratch(tmp_path, monkeypatch)
    (fork.root / "tests" / "test_alpha.py").write_text(
        TEST + "\n\ndef test_needs_a_later_patch():\n    assert clamp(12) == 11\n")
    fork.stack([
        ("alpha-clamp", {"megatron/core/alpha.py": CLAMP}, None, "Why.",
         "tests/test_alpha.py::test_clamps_above_ten tests/test_alpha.py::test_needs_a_later_patch"),
        ("beta-more", {"megatron/core/beta.py": lambda t: t + "BETA_MORE = 1\n"}, None, "Why.",
         "tests/test_alpha.py::test_keeps_small_values"),
    ])
    first, second = mutate(fork.layout, count=3, log=quiet, jobs=2)
    assert first.note == ("its Tests: do not pass on the patch itself "
                          "(tests/test_alpha.py::test_needs_a_later_patch)")
    assert first.score is None and first.killed == 0
    assert second.note == "" and second.killed + len(second.survivors) == 2  # it ran both mutants
