"""Downgrades are refused without --allow-downgrade and warn with it (a dry run only warns);
headline counts cover the package only (issue 15, item 8); a finished bump says how to undo it
(issue 47, item 9)."""

import pytest

import os
import subprocess
import sys
from pathlib import Path

from tests.tools.bumpkit import commit_checkout, ignore_generated, make_fork, replace_line, sh
from tools.rebase.bump.bump import bump
from tools.rebase.bump.forecast import forecast
from tools.rebase.errors import RebaseError

REPO_ROOT = Path(__file__).resolve().parents[3]

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
    data = bump(fork.layout, f"git:{fork.upstream}@v2", log=logged.append, allow_downgrade=True)
    assert any("warning: downgrade: the new base is version 0.42.0, lower than the old base's 0.42.1" in line
               for line in logged), logged
    assert data["upstream_churn"]["package_changes"] == {"added": 1, "modified": 1, "deleted": 1}
    md = fork.layout.report_md.read_text()
    assert "package `megatron/` only: 1 files added, 1 modified, 1 deleted" in md
    assert "**Warning**: downgrade: the new base is version 0.42.0" in md

    logged.clear()
    bump(fork.layout, f"git:{fork.upstream}@v1", log=logged.append, allow_downgrade=True)
    assert any("is an ancestor of the old one" in line for line in logged), logged


def test_forward_bump_has_no_warning(fork):
    fork.stack([("keep-alpha", {A: replace_line("alpha line 10\n", "alpha line 10 fork\n")})])
    fork.upstream_commit({"megatron/core/package_info.py": replace_line("PATCH = 1", "PATCH = 2")}, "up", tag="v2")
    logged = []
    data = bump(fork.layout, f"git:{fork.upstream}@v2", log=logged.append)
    assert data["warnings"] == [] and not any("warning" in line for line in logged)


def test_a_downgrade_is_refused_naming_both_bases_and_nothing_changes(fork):
    fork.stack([("keep-alpha", {A: replace_line("alpha line 10\n", "alpha line 10 fork\n")})])
    fork.upstream_commit({"megatron/core/package_info.py": replace_line("PATCH = 1", "PATCH = 0")}, "lower", tag="v2")
    before = fork.snapshot()
    with pytest.raises(RebaseError) as caught:
        bump(fork.layout, f"git:{fork.upstream}@v2", log=lambda *_: None)
    message = str(caught.value)
    assert message.startswith(f"refusing to move the stack from {fork.upstream}@") and f" onto {fork.upstream}@" in message
    assert "the new base is version 0.42.0, lower than the old base's 0.42.1" in message
    assert "Nothing was changed" in message and "--allow-downgrade" in message
    assert fork.snapshot() == before
    from tools.rebase.bump import journal

    assert not journal.in_progress(fork.layout)  # no journal left: nothing to continue or abort
    # A dry run only warns.
    data = forecast(fork.layout, f"git:{fork.upstream}@v2")
    assert any(w.startswith("downgrade: the new base is version 0.42.0") for w in data["warnings"])
    assert fork.snapshot() == before
    # The CLI refuses the same way (exit 2, the error on stderr) and takes the flag.
    env = dict(os.environ, FORK_REBASE_CACHE=os.environ["FORK_REBASE_CACHE"])
    run = lambda *extra: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "tools.rebase", "-C", str(fork.root), "bump", "--onto", f"git:{fork.upstream}@v2",
         *extra], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    proc = run()
    assert proc.returncode == 2 and "error: refusing to move the stack" in proc.stderr, proc.stderr
    proc = run("--allow-downgrade")
    assert proc.returncode == 0, proc.stderr
    assert "(--allow-downgrade)" in proc.stdout and "bump done" in proc.stdout


def test_a_finished_bump_says_how_to_undo_it_and_that_works(fork):
    fork.stack([("keep-alpha", {A: replace_line("alpha line 10\n", "alpha line 10 fork\n")})])
    ignore_generated(fork)
    commit_checkout(fork, "the fork at v1")
    fork.upstream_commit({"megatron/core/beta.py": replace_line("beta line 3\n", "beta line 3 up\n")}, "up", tag="v2")
    committed = sh("git", "ls-files", "-s", cwd=fork.root)
    logged = []
    bump(fork.layout, f"git:{fork.upstream}@v2", log=logged.append)
    (hint,) = [line for line in logged if "to undo it" in line]
    command = hint.split("to undo it (before committing it): ", 1)[1]
    git_part, _, tool_part = command.partition(", then ")
    # No report was committed before this first bump: clean removes the one it wrote.
    assert git_part == ("git checkout HEAD -- upstream.toml patches && git clean -fdq -- upstream.toml patches "
                        "README.md REBASE_REPORT.md REBASE_REPORT.json")
    assert tool_part == "python -m tools.rebase apply"
    assert sh("git", "status", "--porcelain", cwd=fork.root).strip()  # the bump changed tracked files
    sh("bash", "-c", git_part, cwd=fork.root)
    assert sh("git", "status", "--porcelain", "--untracked-files=all", cwd=fork.root).strip() == ""
    assert sh("git", "ls-files", "-s", cwd=fork.root) == committed
    from tools.rebase.stack.workrepo import apply

    apply(fork.layout, log=lambda *_: None)
    assert "alpha line 10 fork" in (fork.root / A).read_text()
    assert "beta line 3 up" not in (fork.root / "megatron/core/beta.py").read_text()


def test_the_undo_hint_does_not_offer_git_when_the_files_were_not_committed(fork):
    fork.stack([("keep-alpha", {A: replace_line("alpha line 10\n", "alpha line 10 fork\n")})])
    ignore_generated(fork)
    commit_checkout(fork, "the fork at v1")
    (fork.root / "upstream.toml").write_text((fork.root / "upstream.toml").read_text() + "# a local note\n")
    fork.upstream_commit({"megatron/core/beta.py": replace_line("beta line 3\n", "beta line 3 up\n")}, "up", tag="v2")
    logged = []
    bump(fork.layout, f"git:{fork.upstream}@v2", log=logged.append)
    (hint,) = [line for line in logged if "to undo it" in line]
    assert "held changes not committed before the bump, so git cannot give that state back exactly" in hint
    assert "git checkout" not in hint
