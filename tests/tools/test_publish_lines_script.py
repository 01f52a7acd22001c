"""``.ci/publish-lines``, the steps of the workflow that publishes every line on each push to main,
runs locally: it writes ``line/release`` and ``line/<name>`` as ``publish`` does, and pushes only
with ``--push REMOTE`` (issue 58, item 2)."""

import shutil
import subprocess
import sys

from tests.tools.bumpkit import sh
from tests.tools.hostile import REPO_ROOT, tool_env
from tests.tools.linekit import DEV_STACK, RELEASE_STACK, fork_with_dev_line

SCRIPT = REPO_ROOT / ".ci" / "publish-lines"


def run_script(root, *args, cache):
    return subprocess.run([str(root / ".ci" / "publish-lines"), *args], cwd=root, capture_output=True, text=True,
                          env=tool_env({"PYTHON": sys.executable}, cache=cache))


def test_the_workflow_runs_the_script_on_each_push_to_main():
    workflow = (REPO_ROOT / ".github" / "workflows" / "publish-lines.yml").read_text()
    assert "push:\n    branches: [main]" in workflow
    assert "run: .ci/publish-lines --push origin" in workflow
    assert "fetch-depth: 0" in workflow and "contents: write" in workflow


def test_the_script_publishes_every_line_and_pushes_only_when_asked(tmp_path):
    fork, line, dev = fork_with_dev_line(tmp_path)
    (fork.root / ".ci").mkdir()
    shutil.copy(SCRIPT, fork.root / ".ci" / "publish-lines")
    shutil.copytree(REPO_ROOT / "tools", fork.root / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    sh("git", "add", "-A", cwd=fork.root)
    sh("git", "commit", "-qm", "tool and script", cwd=fork.root)
    remote = tmp_path / "remote.git"
    sh("git", "init", "-q", "--bare", str(remote), cwd=tmp_path)
    sh("git", "remote", "add", "origin", str(remote), cwd=fork.root)

    proc = run_script(fork.root, cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    v1 = sh("git", "rev-parse", "v1", cwd=fork.upstream).strip()
    assert sh("git", "log", "--format=%s", "--reverse", f"{v1}..line/release", cwd=fork.root).split() == \
        [name for name, _ in RELEASE_STACK]
    assert sh("git", "log", "--format=%s", "--reverse", f"{dev}..line/dev", cwd=fork.root).split() == \
        [name for name, _ in DEV_STACK]
    assert sh("git", "for-each-ref", cwd=remote) == ""  # nothing pushed

    tips = {b: sh("git", "rev-parse", b, cwd=fork.root).strip() for b in ("line/release", "line/dev")}
    proc = run_script(fork.root, "--push", "origin", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    pushed = dict(reversed(r.split()) for r in sh("git", "for-each-ref", "--format=%(objectname) %(refname)",
                                                  cwd=remote).splitlines())
    assert pushed == {f"refs/heads/{b}": tip for b, tip in tips.items()}

    assert run_script(fork.root, "--bogus", cache=tmp_path / "cache").returncode == 2
