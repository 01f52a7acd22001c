"""Issue 22, item 9: the installed ``megatron-rebase`` runs a folder's own tools/ only when that
folder is a git checkout of this project, and it says which copy runs."""

import shutil
import subprocess
import sys
from pathlib import Path

from tests.tools.bumpkit import sh
from tests.tools.hostile import REPO_ROOT

LAUNCH = "import sys; sys.path.insert(0, {site!r}); from tools.rebase.launch import main; sys.exit(main(['list']))"


def _installed(tmp_path) -> Path:
    site = tmp_path / "site"
    shutil.copytree(REPO_ROOT / "tools", site / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    return site


def _launch(site: Path, cwd: Path):
    # -I: neither the current folder nor PYTHONPATH is on the path, as for an installed console script
    return subprocess.run([sys.executable, "-I", "-c", LAUNCH.format(site=str(site))], cwd=cwd,
                          capture_output=True, text=True)


def test_a_downloaded_folder_with_its_own_tool_is_not_run(tmp_path):
    site = _installed(tmp_path)
    folder = tmp_path / "downloaded"
    (folder / "tools" / "rebase").mkdir(parents=True)
    (folder / "patches").mkdir()
    (folder / "patches" / "series").write_text("")
    (folder / "upstream.toml").write_text("[upstream]\n")
    marker = tmp_path / "FOLDER-CODE-RAN"
    for name in ("__init__.py", "__main__.py", "cli.py", "launch.py"):
        (folder / "tools" / "rebase" / name).write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (folder / "tools" / "__init__.py").write_text("")
    sh("git", "init", "-q", "-b", "main", cwd=folder)  # a git repo, but not of this project
    sh("git", "add", "-A", cwd=folder)
    sh("git", "commit", "-q", "-m", "unrelated", cwd=folder)
    proc = _launch(site, folder)
    assert not marker.exists(), "the folder's own tools/ ran"
    assert f"{folder} is not a git checkout of this project" in proc.stderr, proc.stderr


def test_a_checkout_of_this_project_gets_its_own_tool_and_says_so(tmp_path):
    if not (REPO_ROOT / ".git").exists():
        import pytest

        pytest.skip("this copy of the project is not a git checkout")
    site = _installed(tmp_path)
    proc = _launch(site, REPO_ROOT / "tests")
    assert proc.returncode == 0, proc.stderr
    assert f"running the checkout's own tool, {REPO_ROOT / 'tools' / 'rebase'}" in proc.stderr
    assert proc.stdout.startswith("Base: ")
