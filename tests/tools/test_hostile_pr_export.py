"""Issue 22, items 2, 6 and 10: export writes patches/ through no committed link, never loses a
binary change in silence, and a kill mid-export leaves the old series or the new one, never a mix."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools.bumpkit import ENV, commit, patch_msg, replace_line, sh
from tests.tools.hostile import REPO_ROOT, committed_fork, pull_request, tool


def _retime_all_patches(work: Path) -> None:
    """Give every patch commit of the work repo a new author date: export rewrites every file."""
    base = sh("git", "rev-list", "--max-parents=0", "HEAD", cwd=work).strip()
    env = dict(ENV, GIT_AUTHOR_DATE="2026-06-01T00:00:00Z", GIT_COMMITTER_DATE="2026-06-01T00:00:00Z")
    sh("git", "rebase", "-q", "--exec", "git commit -q --amend --no-edit --reset-author", base, cwd=work, env=env)


@pytest.mark.parametrize("name", ["0002-tweak-beta.patch.tmp", "series.tmp", "0001-keep-alpha.patch.tmp"])
def test_export_writes_through_no_committed_temporary_link(tmp_path, name):
    fork = committed_fork(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    ci = pull_request(fork, tmp_path, lambda pr: os.symlink(victim, pr / "patches" / name))
    assert tool(ci, "apply", cache=tmp_path / "cache").returncode == 0
    _retime_all_patches(ci / ".rebase" / "work")
    commit(ci / ".rebase" / "work", {"megatron/core/gamma.py": replace_line("gamma line 3\n", "gamma 3 fork\n")},
           patch_msg("tweak-gamma"))  # and a new entry for the series
    proc = tool(ci, "export", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "precious\n"
    assert "0003-tweak-gamma.patch" in (ci / "patches" / "series").read_text()
    for patch in sorted((ci / "patches").glob("*.patch")) + [ci / "patches" / "series"]:
        assert not patch.is_symlink() and patch.is_file(), patch
    assert "1 Jun 2026" in (ci / "patches" / "0002-tweak-beta.patch").read_text()


def test_export_refuses_a_binary_change_and_leaves_patches_unchanged(tmp_path):
    fork = committed_fork(tmp_path)
    ci = pull_request(fork, tmp_path, lambda pr: None)
    assert tool(ci, "apply", cache=tmp_path / "cache").returncode == 0
    work = ci / ".rebase" / "work"
    (work / "megatron" / "core" / "weights.bin").write_bytes(bytes(range(256)) * 4)
    sh("git", "add", "-A", cwd=work)
    sh("git", "commit", "-q", "-m", "blob\n\nWhy.\n\nPatch-Name: add-blob\nUpstream-Status: fork-only x\n"
       "Tests: tests/test_dummy.py::test_ok\n", cwd=work)
    before = {p.name: p.read_bytes() for p in (ci / "patches").iterdir() if p.is_file()}
    proc = tool(ci, "export", cache=tmp_path / "cache")
    assert proc.returncode != 0
    assert "refusing a binary change" in proc.stderr and "0003-add-blob.patch" in proc.stderr, proc.stderr
    assert {p.name: p.read_bytes() for p in (ci / "patches").iterdir() if p.is_file()} == before


# Kills the export at the n-th patch file it writes outside .rebase/ (an audit hook sees every open).
KILL_SCRIPT = """
import os, sys
sys.path.insert(0, {repo!r})
count = [0]
def hook(event, args):
    if event != "open" or not isinstance(args[0], str) or "/.rebase/" in args[0]:
        return
    path, mode, flags = args
    writing = (mode and "w" in mode) or (flags and flags & (os.O_WRONLY | os.O_RDWR))
    if writing and (path.endswith(".patch") or path.endswith(".patch.tmp")):
        count[0] += 1
        if count[0] == {n}:
            os._exit(9)
sys.addaudithook(hook)
from tools.rebase.cli import main
sys.exit(main(["-C", {root!r}, "export"]))
"""


def test_a_kill_mid_export_leaves_the_old_series_or_the_new_one_never_a_mix(tmp_path):
    fork = committed_fork(tmp_path)
    ci = pull_request(fork, tmp_path, lambda pr: None)
    env = dict(os.environ, FORK_REBASE_CACHE=str(tmp_path / "cache"))
    assert tool(ci, "apply", cache=tmp_path / "cache").returncode == 0
    old = {p.name: p.read_bytes() for p in (ci / "patches").glob("*.patch")}
    _retime_all_patches(ci / ".rebase" / "work")
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT.format(repo=str(REPO_ROOT), n=2, root=str(ci))],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr
    now = {p.name: p.read_bytes() for p in (ci / "patches").glob("*.patch")}
    assert now == old, "a killed export left a mix of new and old patch files"
    assert not list((ci / "patches").glob("*.tmp"))
    proc = tool(ci, "export", cache=tmp_path / "cache")  # the next export completes and cleans up
    assert proc.returncode == 0, proc.stderr
    new = {p.name: p.read_bytes() for p in (ci / "patches").glob("*.patch")}
    assert set(new) == set(old) and all(new[n] != old[n] for n in old)
    assert sh("git", "status", "--porcelain", "--untracked-files=all", "--", ".", cwd=ci).splitlines() == [
        f" M patches/{n}" for n in sorted(old)]


# Without renameat2(RENAME_EXCHANGE) export renames patches/ aside, then the new folder in; this
# kills it between the two (the audit hook runs before the rename it reports).
FALLBACK_KILL = """
import os, sys
sys.path.insert(0, {repo!r})
import tools.rebase.git.safefs as safefs
safefs.exchange = lambda a, b: False
def hook(event, args):
    if event == "os.rename" and os.fspath(args[1]) == os.path.join({root!r}, "patches"):
        os._exit(9)
sys.addaudithook(hook)
from tools.rebase.cli import main
sys.exit(main(["-C", {root!r}, "export"]))
"""


def test_a_kill_in_the_two_rename_fallback_leaves_a_checkout_the_tool_finds_whole(tmp_path):
    """Issue 46, Low: the kill leaves no patches/, only the aside copy; the next command finds the
    checkout by it, puts the old series back, and the next export completes."""
    fork = committed_fork(tmp_path)
    ci = pull_request(fork, tmp_path, lambda pr: None)
    env = dict(os.environ, FORK_REBASE_CACHE=str(tmp_path / "cache"))
    assert tool(ci, "apply", cache=tmp_path / "cache").returncode == 0
    old = {p.name: p.read_bytes() for p in (ci / "patches").glob("*.patch")}
    _retime_all_patches(ci / ".rebase" / "work")
    proc = subprocess.run([sys.executable, "-c", FALLBACK_KILL.format(repo=str(REPO_ROOT), root=str(ci))],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr
    assert not (ci / "patches").exists()
    proc = tool(ci, "list", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert {p.name: p.read_bytes() for p in (ci / "patches").glob("*.patch")} == old
    proc = tool(ci, "export", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    new = {p.name: p.read_bytes() for p in (ci / "patches").glob("*.patch")}
    assert set(new) == set(old) and all(new[n] != old[n] for n in old)
    assert not [p.name for p in ci.iterdir() if p.name.startswith(".patches-export-")]
