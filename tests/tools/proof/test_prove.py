"""``prove`` on a synthetic stack: proven, unproven, GPU-only and dependent patches, and a checkout
that is left exactly as it was."""

import hashlib
import json
import tempfile

import pytest

from tests.tools.bumpkit import make_fork, quiet, replace_line
from tools.rebase.proof.check import check
from tools.rebase.cli import main
from tools.rebase.errors import RebaseError
from tools.rebase.proof.listing import BEGIN, END, update_readme
from tools.rebase.proof.prove import prove
from tools.rebase.proof.record import read_record

TESTS = {
    "tests/test_alpha.py": (
        "from megatron.core.alpha import value\n\n\n"
        "def test_not_seven():\n    assert value() != 7\n\n\n"
        "def test_seventy_one():\n    assert value() == 71\n"
    ),
    "tests/test_beta.py": (
        "from megatron.core import beta\n\n\n"
        "def test_beta_zero():\n    assert beta.BETA_0 == 0\n"
    ),
    "tests/test_gamma.py": (
        "import pytest\n\n\n"
        "@pytest.mark.skip(reason='needs a CUDA device')\n"
        "def test_gamma_on_gpu():\n    assert False\n"
    ),
}
UPSTREAM = {
    "megatron/core/package_info.py": "MAJOR = 0\nMINOR = 42\nPATCH = 1\nPRE_RELEASE = ''\n",
    "megatron/core/__init__.py": "",
    "megatron/core/alpha.py": "def value():\n    return 7\n",
    "megatron/core/beta.py": "".join(f"BETA_{i} = {i}\n" for i in range(10)),
    "megatron/core/gamma.py": "G = 0\n",
}


def _fork_with_scratch(tmp_path, monkeypatch):
    """A fork on UPSTREAM whose temporary folders go to ``fork.scratch``, so a test can see that
    prove removes every one it made."""
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    fork = make_fork(tmp_path, files=UPSTREAM)
    fork.scratch = scratch
    return fork


@pytest.fixture
def fork(tmp_path, monkeypatch):
    fork = _fork_with_scratch(tmp_path, monkeypatch)
    for rel, text in TESTS.items():
        (fork.root / rel).write_text(text)
    fork.stack([
        ("alpha-seventy", {"megatron/core/alpha.py": replace_line("return 7", "return 70")},
         None, "Why.", "tests/test_alpha.py::test_not_seven"),
        ("beta-extra", {"megatron/core/beta.py": lambda t: t + "BETA_EXTRA = 1\n"},
         None, "Why.", "tests/test_beta.py::test_beta_zero"),
        ("gamma-gpu", {"megatron/core/gamma.py": "G = 1\n"}, None, "Why.", "tests/test_gamma.py"),
        ("alpha-seventy-one", {"megatron/core/alpha.py": replace_line("return 70", "return 71")},
         None, "Why.", "tests/test_alpha.py::test_seventy_one"),
    ])
    return fork


def _tree_digest(path):
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(path).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


def test_verdicts_dropped_dependents_and_untouched_checkout(fork):
    before = fork.snapshot(), _tree_digest(fork.root / "megatron"), _tree_digest(fork.work / ".git")
    proofs = {p.name: p for p in prove(fork.layout, log=quiet)}
    assert {n: p.verdict for n, p in proofs.items()} == {
        "alpha-seventy": "proven",  # without it value() is 7 again (and 71 cannot apply)
        "beta-extra": "unproven",  # its test passes on upstream's beta.py
        "gamma-gpu": "GPU-only",  # every test skipped on this machine
        "alpha-seventy-one": "proven",
    }
    assert proofs["alpha-seventy"].dropped == ["alpha-seventy-one"]
    assert (proofs["alpha-seventy"].tests, proofs["alpha-seventy"].failed) == (1, 1)
    assert (proofs["beta-extra"].tests, proofs["beta-extra"].failed) == (1, 0)
    assert proofs["beta-extra"].passing == ["tests/test_beta.py::test_beta_zero"]
    assert proofs["alpha-seventy"].passing == []
    assert all(not p.dropped for n, p in proofs.items() if n != "alpha-seventy")
    after = fork.snapshot(), _tree_digest(fork.root / "megatron"), _tree_digest(fork.work / ".git")
    assert after == before, "prove must not touch the checkout, its megatron/ or its work repo"
    assert list(fork.scratch.iterdir()) == [], "scratch directories must be removed"


def test_cli_prints_the_table_and_fails_on_an_unproven_patch(fork, capsys):
    assert main(["-C", str(fork.root), "prove", "alpha-seventy", "0004"]) == 0
    out = capsys.readouterr().out
    assert "| patch | tests run | failed without it | failed with it | verdict | note |" in out
    assert "| alpha-seventy | 1 | 1 | 0 | proven | also dropped (need it): alpha-seventy-one |" in out
    assert main(["-C", str(fork.root), "prove", "beta-extra"]) == 1
    captured = capsys.readouterr()
    assert "| beta-extra | 1 | 0 | 0 | unproven |" in captured.out
    assert "1 unproven patch(es): beta-extra" in captured.err


def test_unknown_patch_name_is_an_error(fork):
    with pytest.raises(RebaseError, match="no patch in the series is named 'nope'"):
        prove(fork.layout, ["nope"], log=quiet)


def test_record_feeds_the_readme_and_check_catches_a_stale_record(fork):
    readme = fork.root / "README.md"
    readme.write_text(f"# fork\n\n{BEGIN}\n{END}\n")
    update_readme(fork.layout)
    assert "| not recorded |" in readme.read_text()
    assert main(["-C", str(fork.root), "prove", "--record"]) == 1  # beta-extra is unproven
    record = json.loads((fork.layout.patches / "proof.json").read_text())
    assert [p["verdict"] for p in record["patches"]] == ["proven", "unproven", "GPU-only", "proven"]
    text = readme.read_text()
    assert "| proven 1/1 |" in text and "| unproven |" in text
    assert check(fork.layout, log=quiet) == []
    verdicts, problem = read_record(fork.layout)
    assert problem is None and verdicts["gamma-gpu"]["verdict"] == "GPU-only"
    # Any change to the stack makes the record stale: check reports it as STALE with the rule and
    # the refresh command, and still passes; --strict-records (the maintainer's) fails on it.
    fork.stack([("delta", {"megatron/core/gamma.py": "G = 2\n"}, None, "Why.", "tests/test_gamma.py")])
    update_readme(fork.layout)  # the new row; the Proof column keeps the recorded verdicts
    assert "| proven 1/1 |" in readme.read_text()
    said = []
    assert check(fork.layout, log=said.append) == []
    (notice,) = [line for line in said if "recorded for another stack" in line]
    assert notice.startswith("STALE: patches/proof.json: recorded for another stack")
    assert notice.endswith("python -m tools.rebase prove --record")
    assert any("check: the STALE records are for another stack, which is not a failure" in line for line in said), said
    problems = check(fork.layout, log=quiet, strict_records=True)
    assert any(p.startswith("patches/proof.json: recorded for another stack") and "--strict-records" in p
               for p in problems), problems


def test_record_needs_every_patch(fork):
    assert main(["-C", str(fork.root), "prove", "--record", "alpha-seventy"]) == 2
    assert not (fork.layout.patches / "proof.json").exists()


def test_a_tests_id_naming_no_test_is_reported_not_fatal(fork):
    # One stale id must not stop the patch's other tests from running.
    (fork.root / "tests/test_alpha.py").write_text(
        TESTS["tests/test_alpha.py"].replace("def test_seventy_one", "def test_renamed"))
    (proof,) = prove(fork.layout, ["alpha-seventy-one"], log=quiet)
    assert proof.missing == ["tests/test_alpha.py::test_seventy_one"]
    assert proof.verdict == "unproven"
    (proof,) = prove(fork.layout, ["alpha-seventy"], log=quiet)
    assert (proof.verdict, proof.failed, proof.missing) == ("proven", 1, [])


def test_a_test_file_that_does_not_import_fails_without_hiding_the_others(fork):
    # beta-extra's Tests: now name a file importing what only the patch adds, plus a passing test.
    (fork.root / "tests/test_beta_extra.py").write_text(
        "from megatron.core.beta import BETA_EXTRA\n\n\ndef test_extra():\n    assert BETA_EXTRA == 1\n")
    outcomes = run_tests_without(fork, "beta-extra", ["tests/test_beta_extra.py::test_extra",
                                                      "tests/test_beta.py::test_beta_zero"])
    assert outcomes == {"tests/test_beta_extra.py::test_extra": "failed",
                        "tests/test_beta.py::test_beta_zero": "passed"}


def run_tests_without(fork, name, node_ids):
    """The outcomes ``prove`` sees for ``node_ids`` on the stack without patch ``name``."""
    from tools.rebase.proof import prove as prove_module

    seen = {}

    def runner(run, ids):
        seen.update(prove_module.run_tests(run, node_ids))
        return {i: seen.get(i, "passed") for i in ids}

    prove(fork.layout, [name], log=quiet, runner=runner)
    return seen


def test_later_patch_that_imports_the_proven_ones_module_is_dropped_too(tmp_path, monkeypatch):
    # Without "extra-module", "init-imports-extra" still applies (another file) but megatron.core
    # no longer imports, and the conftest that imports it would stop every test: prove must drop
    # the later patch as well, say so, and still run the proven patch's tests.
    fork = _fork_with_scratch(tmp_path, monkeypatch)
    (fork.root / "tests" / "conftest.py").write_text("import megatron.core  # noqa: F401\n")
    (fork.root / "tests" / "test_extra.py").write_text(
        "def test_extra_value():\n    from megatron.core.extra import VALUE\n    assert VALUE == 5\n")
    fork.stack([
        ("extra-module", {"megatron/core/extra.py": "VALUE = 5\n"}, None, "Why.",
         "tests/test_extra.py::test_extra_value"),
        ("init-imports-extra", {"megatron/core/__init__.py": "from megatron.core.extra import VALUE\n"},
         None, "Why.", "tests/test_extra.py::test_extra_value"),
    ])
    (proof,) = prove(fork.layout, ["extra-module"], log=quiet)
    assert proof.verdict == "proven"
    assert proof.dropped == ["init-imports-extra"]
    assert list(fork.scratch.iterdir()) == [], "scratch directories must be removed"


def test_outcomes_for_a_directory_id_and_a_file_that_does_not_import():
    from tools.rebase.proof.prove import outcomes_for

    report = {"outcomes": {"tests/unit/test_a.py::test_one": "passed",
                           "tests/unit/test_a.py::TestK::test_two": "skipped",
                           "tests/other/test_c.py::test_three": "passed"},
              "collect_errors": ["tests/broken/test_b.py"]}
    got = outcomes_for(["tests/unit", "tests/unit/test_a.py::TestK", "tests/broken",
                        "tests/broken/test_b.py::test_x", "tests/other/test_c.py::test_thre",
                        "tests/missing"], report)
    assert got == {"tests/unit": "passed", "tests/unit/test_a.py::TestK": "skipped",
                   "tests/broken": "failed", "tests/broken/test_b.py::test_x": "failed",
                   "tests/other/test_c.py::test_thre": "not found", "tests/missing": "not found"}


def test_jobs_give_the_serial_verdicts_in_the_serial_order(fork):
    from dataclasses import asdict

    before = fork.snapshot(), _tree_digest(fork.root / "megatron"), _tree_digest(fork.work / ".git")
    serial_log, parallel_log = [], []
    serial = prove(fork.layout, log=serial_log.append)
    (fork.layout.cache / "test-results.json").unlink()  # the whole-stack runs too, in parallel this time
    parallel = prove(fork.layout, log=parallel_log.append, jobs=3)
    assert [asdict(p) for p in parallel] == [asdict(p) for p in serial]
    assert parallel_log == serial_log and len(serial_log) == 4
    after = fork.snapshot(), _tree_digest(fork.root / "megatron"), _tree_digest(fork.work / ".git")
    assert after == before, "prove --jobs must not touch the checkout either"
    assert list(fork.scratch.iterdir()) == [], "every slot's scratch directory must be removed"


def test_cli_refuses_a_bad_jobs_count(fork, capsys):
    assert main(["-C", str(fork.root), "prove", "--jobs", "0"]) == 2
    assert "--jobs needs a count >= 1, got 0" in capsys.readouterr().err


def test_a_mutant_run_stops_at_the_first_failure(tmp_path):
    import shutil
    from pathlib import Path

    from tools.rebase.proof import prove as prove_module

    run = tmp_path / "run"
    (run / "tests").mkdir(parents=True)
    shutil.copy2(Path(prove_module.__file__).with_name("prove_report.py"), run / "_fork_prove_report.py")
    (run / "tests" / "test_two.py").write_text(
        "def test_first():\n    assert False\n\n\ndef test_second():\n    assert False\n")
    ids = ["tests/test_two.py::test_first", "tests/test_two.py::test_second"]
    assert prove_module.run_tests(run, ids) == {ids[0]: "failed", ids[1]: "failed"}
    assert prove_module.run_tests(run, ids, first_failure=True) == {ids[0]: "failed", ids[1]: "not found"}
