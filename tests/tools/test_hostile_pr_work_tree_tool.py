"""Issue 56, item 2 (second half): running the tool from inside ``.rebase/work`` (the upstream
base's tree, where maintainers edit) never imports that tree's ``tools/``. The installed launcher
walks past every folder inside a ``.rebase/`` to the checkout around it and hands over with
``python -P`` (the folder it was started in is not on the path); a copy of the tool that finds
itself loaded from a checkout's ``.rebase/`` refuses to run."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools.bumpkit import sh
from tests.tools.hostile import REPO_ROOT
from tools.rebase.launch import PROJECT_ROOT_COMMIT

LAUNCH = "import sys; sys.path.insert(0, {site!r}); from tools.rebase.launch import main; sys.exit(main(['list']))"


def _copy_tool(dest: Path) -> None:
    shutil.copytree(REPO_ROOT / "tools", dest / "tools", ignore=shutil.ignore_patterns("__pycache__"))


def _project_checkout(where: Path) -> Path:
    """A git repository whose history starts at this project's root commit, holding a pin,
    patches/ and a copy of the tool: what the launcher takes for a checkout of the project."""
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("this copy of the project is not a git checkout")
    where.mkdir(parents=True)
    sh("git", "init", "-q", "-b", "main", cwd=where)
    sh("git", "fetch", "-q", str(REPO_ROOT), PROJECT_ROOT_COMMIT, cwd=where)
    sh("git", "reset", "-q", "--hard", PROJECT_ROOT_COMMIT, cwd=where)
    for child in where.iterdir():
        if child.name != ".git":
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    _copy_tool(where)
    (where / "patches").mkdir()
    (where / "patches" / "series").write_text("")
    (where / "upstream.toml").write_text("[upstream]\n")
    sh("git", "add", "-A", cwd=where)
    sh("git", "commit", "-q", "-m", "a checkout of the project", cwd=where)
    return where


def _shadow(folder: Path, marker: Path) -> None:
    """A ``tools/`` package in ``folder`` whose every module records that it ran."""
    (folder / "tools" / "rebase").mkdir(parents=True)
    (folder / "tools" / "__init__.py").write_text("")
    for name in ("__init__.py", "__main__.py", "cli.py", "launch.py"):
        (folder / "tools" / "rebase" / name).write_text(f"open({str(marker)!r}, 'w').write('ran')\n")


def test_the_launcher_never_takes_a_work_tree_for_a_checkout(tmp_path):
    """``.rebase/work`` made to look like a checkout of the project (a pin, patches/, this project's
    root commit, a tool of its own) is walked past."""
    site = tmp_path / "site"
    _copy_tool(site)
    outer = tmp_path / "outer"
    outer.mkdir()
    (outer / "upstream.toml").write_text("[upstream]\n")  # a checkout around it (not a git one)
    work = _project_checkout(outer / ".rebase" / "work")
    marker = tmp_path / "WORK-TREE-CODE-RAN"
    shutil.rmtree(work / "tools")
    _shadow(work, marker)
    (work / "megatron").mkdir()
    proc = subprocess.run([sys.executable, "-I", "-c", LAUNCH.format(site=str(site))], cwd=work / "megatron",
                          capture_output=True, text=True)
    assert not marker.exists(), "the work tree's tools/ ran"
    assert "running the checkout's own tool" not in proc.stderr, proc.stderr


def test_the_handed_over_run_does_not_import_the_tools_of_the_folder_it_starts_in(tmp_path):
    """Started in a work tree of a real checkout, the launcher hands over to the checkout's tool:
    ``python -m`` would put the work tree first on the path and import its ``tools/``."""
    site = tmp_path / "site"
    _copy_tool(site)
    checkout = _project_checkout(tmp_path / "checkout")
    work = checkout / ".rebase" / "work"
    marker = tmp_path / "WORK-TREE-CODE-RAN"
    _shadow(work, marker)
    proc = subprocess.run([sys.executable, "-I", "-c", LAUNCH.format(site=str(site))], cwd=work,
                          capture_output=True, text=True)
    assert f"running the checkout's own tool, {checkout / 'tools' / 'rebase'}" in proc.stderr, proc.stderr
    assert not marker.exists(), "the work tree's tools/ ran"


def test_a_copy_of_the_tool_inside_a_checkouts_state_folder_refuses_to_run(tmp_path):
    """``python -m tools.rebase`` in ``.rebase/work`` imports the work tree's copy when it has one;
    a copy of this tool there refuses instead of acting on the work tree as a checkout."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "upstream.toml").write_text("[upstream]\n")
    work = checkout / ".rebase" / "work"
    _copy_tool(work)
    (work / "patches").mkdir()
    (work / "patches" / "series").write_text("")
    (work / "upstream.toml").write_text("[upstream]\n")
    proc = subprocess.run([sys.executable, "-m", "tools.rebase", "list"], cwd=work, capture_output=True, text=True,
                          env={k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"refusing to run the copy of the tool at {work / 'tools' / 'rebase'}" in proc.stderr, proc.stderr
