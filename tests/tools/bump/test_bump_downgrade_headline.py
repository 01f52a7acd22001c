"""Downgrades warn and headline counts cover the package only (issue 15, item 8)."""

import pytest

from tests.tools.bumpkit import make_fork, replace_line
from tools.rebase.bump.bump import bump

A = "megatron/core/alpha.py"


@pytest.fixture
def fork(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    return make_fork(tmp_path)


def test_lower_version_and_ancestor_warn_and_counts_split_by_kind(fork):
    fork.stack([("keep-alpha", {A: replace_line("alpha line 10\n", "alpha line 10 fork\n")})])
    fork.upstream_commit({
        "megatron/core/package_info.py": replace_line("PATCH = 1", "PATCH = 0"),
        "megatron/core/new_mod.py": "X = 1\n",
        "megatron/core/delta.py": None,
        **{f"tests/test_{i}.py": "def test():\n    pass\n" for i in range(5)},
        "docs/guide.md": "words\n",
    }, "upstream: lower version, package churn, tests and docs", tag="v2")
    logged = []
    data = bump(fork.layout, f"git:{fork.upstream}@v2", log=logged.append)
    assert any("warning: downgrade: the new base is version 0.42.0, lower than the old base's 0.42.1" in line
               for line in logged), logged
    assert data["upstream_churn"]["package_changes"] == {"added": 1, "modified": 1, "deleted": 1}
    md = fork.layout.report_md.read_text()
    assert "package `megatron/` only: 1 files added, 1 modified, 1 deleted" in md
    assert "**Warning**: downgrade: the new base is version 0.42.0" in md

    logged.clear()
    bump(fork.layout, f"git:{fork.upstream}@v1", log=logged.append)
    assert any("is an ancestor of the old one" in line for line in logged), logged


def test_forward_bump_has_no_warning(fork):
    fork.stack([("keep-alpha", {A: replace_line("alpha line 10\n", "alpha line 10 fork\n")})])
    fork.upstream_commit({"megatron/core/package_info.py": replace_line("PATCH = 1", "PATCH = 2")}, "up", tag="v2")
    logged = []
    data = bump(fork.layout, f"git:{fork.upstream}@v2", log=logged.append)
    assert data["warnings"] == [] and not any("warning" in line for line in logged)
