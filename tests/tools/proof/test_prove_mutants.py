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
    assert not any("mutant scores" in p for p in check(fork.layout, log=quiet))
    fork.add_patch("beta-more", {"megatron/core/beta.py": lambda t: t + "BETA_MORE = 1\n"})
    from tools.rebase.stack.workrepo import export

    export(fork.layout, log=quiet)
    assert any("mutant scores recorded for another stack" in p for p in check(fork.layout, log=quiet))


def test_bad_count_is_refused(fork, capsys):
    assert main(["-C", str(fork.root), "prove", "--mutants", "0"]) != 0
    assert "--mutants needs a count >= 1, got 0" in capsys.readouterr().err
