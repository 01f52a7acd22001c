"""Every line is one install (issue 58): ``MEGATRON_FORK_LINE=NAME pip install .`` builds that
line from a local clone of upstream (``FORK_REBASE_MIRROR``), and a branch ``publish`` wrote installs
with ``pip install git+file://REPO@BRANCH`` through upstream's own packaging. The upstream is a toy
(tests/tools/linekit.py): CI has no GitHub. pip runs are slow on 2 cores, so there are two."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.tools.bumpkit import sh
from tests.tools.hostile import REPO_ROOT, tool_env
from tests.tools.linekit import DEV_STACK, fork_with_dev_line
from tools.rebase.cli import main
from tools.rebase.stack.archive import commit_tree_digest

REMOTE = "https://example.invalid/upstream.git"
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def buildable(fork):
    """The fork with this repository's setup.py, pyproject.toml and tools/, committed."""
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy(REPO_ROOT / name, fork.root / name)
    shutil.copytree(REPO_ROOT / "tools", fork.root / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    (fork.root / "README.md").write_text("# fork\n")
    sh("git", "add", "-A", cwd=fork.root)
    sh("git", "commit", "-qm", "build", cwd=fork.root)


@pytest.mark.slow
def test_megatron_fork_line_builds_that_line_from_a_mirror(tmp_path):
    fork, line, dev = fork_with_dev_line(tmp_path)
    # The line's pin names a URL this machine cannot reach: the commit comes from the mirror only.
    line.layout.pin.write_text(f'[upstream]\nkind = "git"\nurl = "{REMOTE}"\ncommit = "{dev}"\n'
                               f'tree_sha256 = "{commit_tree_digest(fork.upstream, dev)}"\n')
    buildable(fork)
    ci = tmp_path / "clone"
    sh("git", "clone", "-q", str(fork.root), str(ci), cwd=tmp_path)
    out = tmp_path / "wheels"
    env = tool_env({**OFFLINE, "MEGATRON_FORK_LINE": "dev", "FORK_REBASE_MIRROR": str(fork.upstream)},
                   cache=tmp_path / "empty-cache")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                           str(out), str(ci)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    assert wheel.name.startswith("megatron_core-0.42.1+rl.dev.2.")
    with zipfile.ZipFile(wheel) as z:
        assert "beta line 5 dev" in z.read("megatron/core/beta.py").decode()  # the line's own patch
        assert "gamma dev" in z.read("megatron/core/gamma.py").decode()        # on the line's upstream commit
    # A line that does not exist is named, with the lines there are.
    env["MEGATRON_FORK_LINE"] = "nope"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                           str(tmp_path / "none"), str(ci)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "MEGATRON_FORK_LINE='nope': no such line" in proc.stderr
    assert "lines: dev" in proc.stderr


@pytest.mark.slow
def test_a_published_branch_installs_with_pip_from_git(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork, line, dev = fork_with_dev_line(tmp_path)
    assert main(["-C", str(fork.root), "publish", "--line", "dev"]) == 0
    assert sh("git", "log", "--format=%s", "--reverse", f"{dev}..line/dev", cwd=fork.root).split() == \
        [name for name, _ in DEV_STACK]
    target = tmp_path / "site"
    env = dict(tool_env(OFFLINE), GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--target", str(target), f"git+file://{fork.root}@line/dev"],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = "import megatron.core.package_info as p; print(p.__file__)"  # the toy's other modules are text
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=dict(clean, PYTHONPATH=str(target)),
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(target))
    installed = (target / "megatron" / "core")
    assert "beta line 5 dev" in (installed / "beta.py").read_text()
    assert "alpha line 10 fork" in (installed / "alpha.py").read_text()
    assert "gamma dev" in (installed / "gamma.py").read_text()
