"""Issue 22, items 1 and 11: a pull request that commits files under .rebase/ or megatron/ (the
tool's state and output) gets an error naming them; nothing is written through them, no hook runs,
and the mirror cache never reaches the checkout's own repository."""

import hashlib
import os
from pathlib import Path

import pytest

from tests.tools.bumpkit import sh
from tests.tools.hostile import committed_fork, pull_request, tool


def _link(rel: str, target: Path):
    def payload(pr: Path):
        (pr / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, pr / rel)
    return payload


def test_a_committed_lock_link_is_refused_and_its_target_is_not_truncated(tmp_path):
    fork = committed_fork(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    ci = pull_request(fork, tmp_path, _link(".rebase/lock", victim))
    for command in ("apply", "check"):
        proc = tool(ci, command, cache=tmp_path / "cache")
        assert proc.returncode != 0 and ".rebase/lock" in proc.stderr, proc.stderr
    assert victim.read_text() == "precious\n"


def test_a_committed_work_repo_link_is_refused_and_nothing_is_checked_out_there(tmp_path):
    fork = committed_fork(tmp_path)
    target = tmp_path / "site-packages"
    target.mkdir()
    ci = pull_request(fork, tmp_path, _link(".rebase/work", target))
    proc = tool(ci, "apply", cache=tmp_path / "cache")
    assert proc.returncode != 0 and ".rebase/work" in proc.stderr, proc.stderr
    assert list(target.iterdir()) == []


def test_a_committed_cache_repo_with_hooks_is_refused_and_no_hook_runs(tmp_path):
    fork = committed_fork(tmp_path)
    marker = tmp_path / "HOOK-RAN"
    url = (fork.root / "upstream.toml").read_text().split('url = "')[1].split('"')[0]
    key = hashlib.sha256(url.encode()).hexdigest()[:16]

    def payload(pr: Path):
        repo = pr / ".rebase" / "cache" / "git" / f"{key}.git"
        repo.mkdir(parents=True)
        sh("git", "init", "-q", "--bare", str(repo), cwd=pr)
        for keep in ("objects/pack/.keep", "refs/heads/.keep", "refs/tags/.keep"):  # git commits no empty folder
            (repo / keep).write_text("")
        for hook in ("reference-transaction", "post-checkout", "post-commit", "applypatch-msg"):
            (repo / "hooks" / hook).write_text(f"#!/bin/sh\necho ran >> {marker}\n")
            (repo / "hooks" / hook).chmod(0o755)
        (repo / "megatron-rebase-mirror").write_text(f"created by tools.rebase for {url}\n")  # a marker

    ci = pull_request(fork, tmp_path, payload)
    proc = tool(ci, "check")  # the default cache: .rebase/cache inside the checkout
    assert proc.returncode != 0 and f".rebase/cache/git/{key}.git" in proc.stderr, proc.stderr
    assert not marker.exists()


def test_hooks_in_the_tool_owned_work_repo_never_run(tmp_path):
    """A checkout that is not a git repository (an unpacked archive) can carry .rebase/ whole: git
    runs no hook of the tool's repositories whatever they hold."""
    fork = committed_fork(tmp_path)
    marker = tmp_path / "HOOK-RAN"
    ci = pull_request(fork, tmp_path, lambda pr: None)
    assert tool(ci, "apply", cache=tmp_path / "cache").returncode == 0
    hooks = ci / ".rebase" / "work" / ".git" / "hooks"
    for hook in ("reference-transaction", "post-checkout", "post-commit", "applypatch-msg", "pre-applypatch",
                 "post-applypatch"):
        (hooks / hook).write_text(f"#!/bin/sh\necho {hook} >> {marker}\n")
        (hooks / hook).chmod(0o755)
    (ci / "patches" / "0002-tweak-beta.patch").write_text(
        (ci / "patches" / "0002-tweak-beta.patch").read_text().replace("Why it exists.", "Why, again."))
    proc = tool(ci, "apply", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert tool(ci, "check", cache=tmp_path / "cache").returncode == 0
    assert not marker.exists(), marker.read_text()


def test_a_foreign_cache_repo_is_refused(tmp_path):
    fork = committed_fork(tmp_path)
    ci = pull_request(fork, tmp_path, lambda pr: None)
    url = (ci / "upstream.toml").read_text().split('url = "')[1].split('"')[0]
    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    foreign = tmp_path / "shared-cache" / "git" / f"{key}.git"
    foreign.mkdir(parents=True)
    sh("git", "init", "-q", "--bare", str(foreign), cwd=tmp_path)
    proc = tool(ci, "apply", cache=tmp_path / "shared-cache")
    assert proc.returncode != 0 and f"{foreign}: this cache repository was not created by tools.rebase" in proc.stderr


@pytest.mark.parametrize("rel, content", [
    (".rebase/bump/journal.json", '{"phase": "stopped"}\n'),
    (".rebase/state.json", '{"digest": "x", "tip": "y"}\n'),
    ("megatron/core/sitecustomize.py", "import os\n"),
])
def test_a_committed_file_under_rebase_or_megatron_is_an_error_naming_it(tmp_path, rel, content):
    fork = committed_fork(tmp_path)

    def payload(pr: Path):
        (pr / rel).parent.mkdir(parents=True, exist_ok=True)
        (pr / rel).write_text(content)

    ci = pull_request(fork, tmp_path, payload)
    for command in ("apply", "check", "export"):
        proc = tool(ci, command, cache=tmp_path / "cache")
        assert proc.returncode != 0, (command, proc.stdout)
        assert f"{rel} is tracked by git" in proc.stderr, (command, proc.stderr)


def test_an_empty_mirror_left_by_a_kill_is_rebuilt_and_the_checkouts_repository_is_never_written(tmp_path):
    fork = committed_fork(tmp_path)
    ci = pull_request(fork, tmp_path, lambda pr: None)
    url = (ci / "upstream.toml").read_text().split('url = "')[1].split('"')[0]
    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    (ci / ".rebase" / "cache" / "git" / f"{key}.git").mkdir(parents=True)  # killed between mkdir and init
    before = sh("git", "for-each-ref", cwd=ci)
    objects_before = sh("git", "count-objects", "-v", cwd=ci)
    proc = tool(ci, "apply")  # the default in-checkout cache
    assert proc.returncode == 0, proc.stderr
    assert tool(ci, "apply").returncode == 0
    assert sh("git", "for-each-ref", cwd=ci) == before
    assert "upstream-history" not in sh("git", "for-each-ref", cwd=ci)
    assert sh("git", "count-objects", "-v", cwd=ci) == objects_before


def test_a_killed_applys_build_worktree_is_removed_by_the_next_apply(tmp_path):
    fork = committed_fork(tmp_path)
    ci = pull_request(fork, tmp_path, lambda pr: None)
    assert tool(ci, "apply", cache=tmp_path / "cache").returncode == 0
    sh("git", "worktree", "add", "-q", "--detach", str(ci / ".rebase" / "build-killed"), "HEAD",
       cwd=ci / ".rebase" / "work")
    (ci / "patches" / "0001-keep-alpha.patch").write_text(
        (ci / "patches" / "0001-keep-alpha.patch").read_text().replace("Why it exists.", "Why, again."))
    assert tool(ci, "apply", cache=tmp_path / "cache").returncode == 0
    assert not list((ci / ".rebase").glob("build-*"))
    assert "build-killed" not in sh("git", "worktree", "list", cwd=ci / ".rebase" / "work")

