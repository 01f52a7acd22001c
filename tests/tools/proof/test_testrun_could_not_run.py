"""Tests that could not run (issue 15, item 9): a conftest import error, a missing module and an
empty collection are "could not run: <error>", not failures; the report and the bump say so."""

import pytest

from tests.tools.bumpkit import make_fork, quiet, replace_line, sh
from tools.rebase.bump.bump import Stopped, bump, bump_continue
from tools.rebase.report.render import _tests_cell
from tools.rebase.proof.testrun import run_pytest


def _tree(root, files):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_outcomes_separate_environment_from_patch(tmp_path):
    bad = _tree(tmp_path / "bad", {"tests/conftest.py": "import no_such_module_for_conftest\n",
                                   "tests/test_a.py": "def test_ok():\n    pass\n"})
    (outcome,) = run_pytest(bad, ["tests/test_a.py::test_ok"]).values()
    assert outcome.startswith("could not run: ") and "no_such_module_for_conftest" in outcome

    good = _tree(tmp_path / "good", {
        "tests/test_b.py": "import torch_is_not_installed_here\n\ndef test_x():\n    pass\n",
        "tests/test_c.py": "def test_pass():\n    pass\n\ndef test_fail():\n    assert False\n",
        "tests/empty/test_none.py": "X = 1\n",
    })
    got = run_pytest(good, ["tests/test_b.py", "tests/test_c.py::test_pass", "tests/test_c.py::test_fail"])
    assert got["tests/test_b.py"] == (
        "could not run: ModuleNotFoundError: No module named 'torch_is_not_installed_here'")
    assert got["tests/test_c.py::test_pass"] == "passed"
    assert got["tests/test_c.py::test_fail"] == "failed"
    (empty,) = run_pytest(good, ["tests/empty"]).values()
    assert empty == "could not run: pytest collected no tests (exit 5)"

    cell = _tests_cell({"tests": {"t::a": "could not run: ImportError: x", "t::b": "could not run: ImportError: x"}})
    assert cell == "could not run (2/2): ImportError: x" and "FAILED" not in cell


def test_bump_stop_blames_the_environment_not_the_patch(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork = make_fork(tmp_path)
    b = "megatron/core/beta.py"
    fork.stack([("tweak-beta", {b: replace_line("beta line 5\n", "beta line 5 fork\n")})])
    fork.upstream_commit({b: replace_line("beta line 5\n", "beta line 5 up\n")}, "up", tag="v2")
    with pytest.raises(Stopped):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet)
    text = (fork.work / b).read_text()
    (fork.work / b).write_text(text.split("<<<<<<<")[0] + "beta line 5 both\n" + text.split(">>>>>>>")[1].split("\n", 1)[1])
    sh("git", "add", b, cwd=fork.work)
    with pytest.raises(Stopped) as stop:
        bump_continue(fork.layout, log=quiet,
                      test_runner=lambda layout, name, ids: {i: "could not run: ImportError: torch" for i in ids})
    assert "could not run (the environment, not the patch)" in str(stop.value)
    assert "Fix the patch" not in str(stop.value)
