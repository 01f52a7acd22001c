"""``prove``'s verdict is "fails without, passes with" (issue 54, item 1): a patch whose ``Tests:``
fail on the whole stack is reported as such (``fails with it``, exit 1), however many failed
without it, and each failing test says whether the pristine base fails it too (upstream broke it,
naming the upstream commit that changed the name in the error) or only the stack does."""

import pytest

from tests.tools.bumpkit import commit, init, make_fork, quiet, replace_line, sh
from tools.rebase.cli import main
from tools.rebase.proof.failures import STACK, UNCLEAR, UPSTREAM, classify, error_class, symbol_of
from tools.rebase.proof.prove import prove

BASE = {
    "megatron/core/package_info.py": "MAJOR = 0\nMINOR = 42\nPATCH = 1\nPRE_RELEASE = ''\n",
    "megatron/core/__init__.py": "",
    "megatron/core/alpha.py": "def value():\n    return 7\n",
    "megatron/core/beta.py": "class Helper:\n    pass\n",
    "megatron/core/gamma.py": "from megatron.core.beta import Helper\n\n\ndef make():\n    return Helper()\n",
}
ALPHA_TEST = ("from megatron.core.alpha import value\n\n\n"
              "def test_seventy():\n    assert value() == 70\n")


def test_error_classes_and_symbols():
    assert error_class("NameError: name 'Helper' is not defined") == "NameError"
    assert error_class("assert 7 == 70") == "AssertionError"
    assert error_class("ImportError: cannot import name 'Helper' from 'megatron.core.beta'") == "ImportError"
    assert symbol_of("ImportError: cannot import name 'Helper' from 'megatron.core.beta'") == "Helper"
    assert symbol_of("AttributeError: module 'm' has no attribute 'go'") == "go"
    kinds = classify({"a": ("failed", "NameError: name 'x' is not defined"), "b": ("failed", "assert 1 == 2"),
                      "c": ("failed", "NameError: name 'x' is not defined"), "d": ("passed", ""),
                      "e": ("failed", "assert 1 == 2")},
                     {"a": ("failed", "NameError: name 'x' is not defined"), "b": ("failed", "assert 1 == 3"),
                      "c": ("failed", "ModuleNotFoundError: No module named 'megatron.core.fork'"),
                      "e": ("failed", "assert 1 == 2")})
    assert kinds == {"a": UPSTREAM, "b": STACK, "c": STACK, "e": UNCLEAR}


@pytest.fixture
def fork(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork = make_fork(tmp_path, files=BASE)
    (fork.root / "tests" / "test_alpha.py").write_text(ALPHA_TEST)
    return fork


def test_a_patch_whose_tests_fail_with_the_whole_stack_is_not_proven(fork, capsys):
    # "seventy" makes its test pass; a later patch changes the value again: on the whole stack
    # seventy's test fails, although it fails without seventy too (the old verdict: proven)
    fork.stack([
        ("seventy", {"megatron/core/alpha.py": replace_line("return 7", "return 70")},
         None, "Why.", "tests/test_alpha.py::test_seventy"),
        ("seventy-one", {"megatron/core/alpha.py": replace_line("return 70", "return 71")},
         None, "Why.", "tests/test_dummy.py::test_ok"),
    ])
    proofs = {p.name: p for p in prove(fork.layout, ["seventy"], log=quiet)}
    p = proofs["seventy"]
    assert p.failed == 1, "it still fails without the patch"
    assert p.verdict == "fails with it"
    assert p.failed_with == ["tests/test_alpha.py::test_seventy"]
    assert "fails only with the stack" in p.note and "assert 71 == 70" in p.note
    assert main(["-C", str(fork.root), "prove", "seventy"]) == 1
    err = capsys.readouterr().err
    assert "fail with the whole stack: seventy" in err


def test_a_test_the_pristine_base_breaks_too_names_the_upstream_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    upstream = tmp_path / "upstream"
    init(upstream, BASE, "upstream v0")
    # upstream renames Helper but forgets gamma.py: the base itself no longer imports gamma
    commit(upstream, {"megatron/core/beta.py": replace_line("class Helper:", "class Assistant:")},
           "upstream: rename Helper to Assistant")
    sh("git", "tag", "v1", cwd=upstream)
    renamed = sh("git", "rev-parse", "HEAD", cwd=upstream).strip()
    fork = make_fork(tmp_path, files=BASE)
    (fork.root / "tests" / "test_gamma.py").write_text(
        "from megatron.core.alpha import value\nfrom megatron.core.gamma import make\n\n\n"
        "def test_made():\n    assert make() is not None and value() == 70\n")
    fork.stack([("seventy", {"megatron/core/alpha.py": replace_line("return 7", "return 70")},
                 None, "Why.", "tests/test_gamma.py::test_made")])
    (p,) = prove(fork.layout, log=quiet)
    assert p.verdict == "fails with it"
    assert "fails on the pristine new base too (upstream broke it)" in p.note
    assert "cannot import name 'Helper'" in p.note
    assert f"upstream {renamed[:12]} (upstream: rename Helper to Assistant) last changed 'Helper'" in p.note


def test_results_on_an_unchanged_stack_are_reused(fork):
    fork.stack([("seventy", {"megatron/core/alpha.py": replace_line("return 7", "return 70")},
                 None, "Why.", "tests/test_alpha.py::test_seventy")])
    logged = []
    first = prove(fork.layout, log=logged.append)
    assert not any("reused" in e for e in logged)
    logged.clear()
    again = prove(fork.layout, log=logged.append)
    assert any("1 of 1 test result(s) on the whole stack reused" in e for e in logged), logged
    assert [p.verdict for p in again] == [p.verdict for p in first] == ["proven"]
    # a changed test is a new key: run again
    (fork.root / "tests" / "test_alpha.py").write_text(ALPHA_TEST.replace("== 70", "== 71"))
    logged.clear()
    (p,) = prove(fork.layout, log=logged.append)
    assert not any("reused" in e for e in logged)
    assert p.verdict == "fails with it"
