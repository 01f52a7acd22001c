"""Issue 22, the tracked-state check (``Layout.refuse_tracked``) when ``git ls-files`` fails: a
repository git reads but cannot answer for (a damaged index) is an error, while a ``.git`` git finds
no repository at and a checkout owned by another user (CI containers) still work like a tarball."""

import os
import shutil
import subprocess

import pytest

from tests.tools.bumpkit import sh
from tests.tools.hostile import committed_fork, pull_request, tool

FOREIGN_UID = 54321


def _commit_state_file(pr):
    (pr / ".rebase").mkdir()
    (pr / ".rebase" / "state.json").write_text('{"digest": "x", "tip": "y"}\n')


def test_a_damaged_index_is_an_error_naming_git_s_answer_and_nothing_is_written(tmp_path):
    fork = committed_fork(tmp_path)
    ci = pull_request(fork, tmp_path, _commit_state_file)
    (ci / ".git" / "index").write_bytes(b"this is no git index; " * 8)
    for command in ("apply", "check", "export"):
        proc = tool(ci, command, cache=tmp_path / "cache")
        assert proc.returncode != 0, (command, proc.stdout, proc.stderr)
        assert "git ls-files failed (exit 128" in proc.stderr and "index file corrupt" in proc.stderr, proc.stderr
        assert "cannot tell whether a commit put files under .rebase/ or megatron/" in proc.stderr
    assert not (ci / "megatron").exists()
    assert sorted(p.name for p in (ci / ".rebase").iterdir()) == ["state.json"]  # only the committed file


def test_a_git_file_pointing_at_no_repository_is_passed_over_like_a_tarball(tmp_path):
    """A worktree's or submodule's checkout copied into a container: its ``.git`` names a folder
    that is not there, git answers "not a git repository", and the checkout builds."""
    fork = committed_fork(tmp_path)
    ci = pull_request(fork, tmp_path, lambda pr: None)
    shutil.rmtree(ci / ".git")
    (ci / ".git").write_text(f"gitdir: {tmp_path / 'host-only' / 'worktrees' / 'ci'}\n")
    proc = tool(ci, "apply", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert (ci / "megatron" / "core" / "alpha.py").read_text().count("alpha line 10 fork") == 1


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="needs root to hand the checkout to another user")
@pytest.mark.parametrize("hostile", [False, True])
def test_a_checkout_owned_by_another_user_builds_and_still_refuses_tracked_state(tmp_path, hostile):
    """CI containers run as a user that does not own the checkout: git refuses such a repository
    ("dubious ownership") when it discovers it, so failing closed on that answer would break
    ``pip install .`` there. The tool names the repository itself, git reads its index, and a
    committed ``.rebase/state.json`` is still refused."""
    fork = committed_fork(tmp_path)
    ci = pull_request(fork, tmp_path, _commit_state_file if hostile else (lambda pr: None))
    sh("chown", "-R", f"{FOREIGN_UID}:{FOREIGN_UID}", ci, cwd=tmp_path)
    plain_git = subprocess.run(["git", "status"], cwd=ci, capture_output=True, text=True, env={
        "PATH": os.environ["PATH"], "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"})
    assert "detected dubious ownership" in plain_git.stderr, plain_git.stderr  # the CI container's case
    proc = tool(ci, "apply", cache=tmp_path / "cache")
    if hostile:
        assert proc.returncode != 0 and ".rebase/state.json is tracked by git" in proc.stderr, proc.stderr
        assert not (ci / "megatron").exists()
    else:
        assert proc.returncode == 0, proc.stderr
        assert (ci / "megatron" / "core" / "beta.py").read_text().count("beta line 5 fork") == 1
