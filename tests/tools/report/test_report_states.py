"""``report`` between two committed states of a fork's patches/ (and with --run-tests)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools.bumpkit import make_fork, quiet, replace_line, sh
from tools.rebase.stack.workrepo import export

REPO_ROOT = Path(__file__).resolve().parents[3]
A, B = "megatron/core/alpha.py", "megatron/core/beta.py"


@pytest.mark.slow
def test_report_between_two_commits_of_patches(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork = make_fork(tmp_path)
    (fork.root / ".gitignore").write_text("/megatron/\n/.rebase/\n")
    fork.stack([
        ("one", {A: replace_line("alpha line 3\n", "alpha line 3 fork\n")}),
        ("two", {B: replace_line("beta line 9\n", "beta line 9 fork\n")}),
    ])
    sh("git", "init", "-q", "-b", "main", cwd=fork.root)
    sh("git", "add", "-A", cwd=fork.root)
    sh("git", "commit", "-q", "-m", "state 1", cwd=fork.root)
    # Edit patch "two" (its change), add a third one, export, commit state 2.
    sh("git", "checkout", "-q", "HEAD~1", cwd=fork.work)
    (fork.work / B).write_text((fork.work / B).read_text().replace("beta line 9\n", "beta line 9 fork v2\n"))
    sh("git", "commit", "-q", "-a", "-C", "patched", cwd=fork.work)
    (fork.work / A).write_text((fork.work / A).read_text().replace("alpha line 30\n", "alpha line 30 new\n"))
    sh("git", "commit", "-q", "-a", "-m",
       "three\n\nWhy.\n\nPatch-Name: three\nUpstream-Status: not-submitted\nTests: tests/test_dummy.py::test_ok\n",
       cwd=fork.work)
    sh("git", "branch", "-f", "patched", "HEAD", cwd=fork.work)
    sh("git", "checkout", "-q", "patched", cwd=fork.work)
    export(fork.layout, log=quiet)
    sh("git", "add", "-A", cwd=fork.root)
    sh("git", "commit", "-q", "-m", "state 2", cwd=fork.root)
    md, js = tmp_path / "states.md", tmp_path / "states.json"
    env = dict(os.environ, FORK_REBASE_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run(
        [sys.executable, "-m", "tools.rebase", "-C", str(fork.root), "report", "--old", "HEAD~1", "--new", "HEAD",
         "--output", str(md), "--json", str(js), "--run-tests"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(js.read_text())
    statuses = [(r["status"], [c["subject"] for c in r["new"]]) for r in data["mapping"]]
    assert statuses == [("identical", ["one"]), ("modified", ["two"]), ("new", ["three"])]
    assert data["mapping"][2]["tests"] == {"tests/test_dummy.py::test_ok": "passed"}
    text = md.read_text()
    assert "| Tests |" in text and "passed (1)" in text
    # Working tree as the new side (default) equals HEAD here.
    proc = subprocess.run(
        [sys.executable, "-m", "tools.rebase", "-C", str(fork.root), "report", "--old", "HEAD~1",
         "--output", str(tmp_path / "wt.md"), "--json", str(tmp_path / "wt.json")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    wt = json.loads((tmp_path / "wt.json").read_text())
    assert [r["status"] for r in wt["mapping"]] == [r["status"] for r in data["mapping"]]
    proc = subprocess.run(
        [sys.executable, "-m", "tools.rebase", "-C", str(fork.root), "report", "--old", "nosuchrev"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "'nosuchrev' is not a commit" in proc.stderr
