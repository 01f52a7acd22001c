"""A bump finishes only when every patch's ``Tests:`` pass with the whole stack on the new base
(issue 54, item 1). A new base that is itself broken made a clean bump finish green; now the bump
stops, says the pristine base fails the same way (upstream broke it) and names the upstream commit;
a test that fails only with the stack is called the stack's. The gate's results of an unchanged
stack are reused by the next ``--continue``; ``--jobs`` runs it in parallel."""

import pytest

from tests.tools.bumpkit import make_fork, quiet, replace_line, resolve_conflict
from tools.rebase.bump import journal as jr
from tools.rebase.bump.bump import Stopped, bump, bump_continue
from tools.rebase.cli import main

ALPHA, BETA = "megatron/core/alpha.py", "megatron/core/beta.py"
BASE = {
    "megatron/core/package_info.py": "MAJOR = 0\nMINOR = 42\nPATCH = 1\nPRE_RELEASE = ''\n",
    "megatron/core/__init__.py": "",
    ALPHA: "def value():\n    return 7\n" + "".join(f"\n\ndef pad_{i}():\n    return {i}\n" for i in range(12)),
    BETA: "class Helper:\n    pass\n",
    "megatron/core/gamma.py": "from megatron.core.beta import Helper\n\n\ndef make():\n    return Helper()\n",
}
GAMMA_TEST = ("from megatron.core.gamma import make\n\n\n"
              "def test_made():\n    assert make() is not None\n")
ALPHA_TEST = ("from megatron.core.alpha import value\n\n\n"
              "def test_seventy():\n    assert value() == 70\n")


@pytest.fixture
def fork(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork = make_fork(tmp_path, files=BASE)
    (fork.root / "tests" / "test_gamma.py").write_text(GAMMA_TEST)
    (fork.root / "tests" / "test_alpha.py").write_text(ALPHA_TEST)
    fork.stack([
        ("seventy", {ALPHA: replace_line("    return 7\n", "    return 70\n")}, None, "Why.",
         "tests/test_alpha.py::test_seventy"),
        ("uses-gamma", {"megatron/core/gamma.py": lambda t: t + "\n\nFORK = 1\n"}, None, "Why.",
         "tests/test_gamma.py::test_made"),
    ])
    return fork


def test_a_clean_bump_onto_a_broken_base_stops_and_names_the_upstream_commit(fork):
    # upstream renames Helper and forgets gamma.py: the new base itself no longer imports gamma.
    # Both patches merge cleanly; the lint's finding in gamma.py (an import of a name beta.py no
    # longer defines) is upstream's own, on the pristine base too, so it does not stop the bump:
    # the tests do.
    rename = fork.upstream_commit({BETA: replace_line("class Helper:", "class Assistant:")},
                                  "upstream: rename Helper to Assistant", tag="v2")
    with pytest.raises(Stopped) as stop:
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet)
    text = str(stop.value)
    assert "the new base itself breaks tests" in text, text
    assert "uses-gamma: tests/test_gamma.py::test_made: fails on the pristine new base too (upstream broke it)" in text
    assert "cannot import name 'Helper'" in text
    assert f"upstream {rename[:12]} (upstream: rename Helper to Assistant) last changed 'Helper'" in text
    assert "seventy" not in text.split("broke it")[0], "the passing patch is not blamed"
    assert jr.load(fork.layout).phase == "tests-failed"
    # nothing changed: the next --continue reuses the results and stops the same way
    logged = []
    with pytest.raises(Stopped, match="the new base itself breaks tests"):
        bump_continue(fork.layout, log=logged.append)
    assert any("2 of 2 result(s) of this stack reused" in e for e in logged), logged


def test_a_test_that_fails_only_with_the_stack_is_the_stacks(fork, capsys):
    fork.upstream_commit({ALPHA: replace_line("    return 7\n", "    return 8\n")}, "upstream: eight", tag="v2")
    assert main(["-C", str(fork.root), "bump", "--onto", f"git:{fork.upstream}@v2", "--jobs", "2"]) == 1
    assert "seventy" in capsys.readouterr().err
    resolve_conflict(fork.work, ALPHA, "    return 80")  # a wrong resolution
    assert main(["-C", str(fork.root), "bump", "--continue"]) == 1
    err = capsys.readouterr().err
    assert "seventy: tests/test_alpha.py::test_seventy: fails only with the stack" in err, err
    assert "assert 80 == 70" in err
    assert jr.load(fork.layout).jobs == 2, "--jobs is kept for --continue"


def test_no_tests_skips_the_tests_of_the_gate(fork):
    fork.upstream_commit({BETA: replace_line("class Helper:", "class Assistant:")}, "upstream: rename", tag="v2")
    data = bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, run_tests=False)
    assert data is not None and not jr.in_progress(fork.layout)
