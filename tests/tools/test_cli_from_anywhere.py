"""``python -m tools.rebase`` and the installed ``megatron-rebase`` work from any directory of a checkout."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_tool(cwd, *args, extra_path=None):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MEGATRON_REBASE_IN_CHECKOUT")}
    if extra_path:
        env["PYTHONPATH"] = str(extra_path)
    return subprocess.run([sys.executable, "-m", "tools.rebase", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)


def test_module_form_works_from_tests_without_an_install():
    # Seen from tests/, tests/tools is a package named "tools": it must not shadow the tool.
    from_root = run_tool(ROOT, "list")
    from_tests = run_tool(ROOT / "tests", "list")
    assert from_root.returncode == 0, from_root.stderr
    assert from_tests.returncode == 0, from_tests.stderr
    assert from_tests.stdout == from_root.stdout
    assert from_tests.stdout.startswith("Base: ")


@pytest.mark.parametrize("subdir", ["tests", "tests/tools", "tests/unit_tests/transformer", "docs", "patches"])
def test_installed_tool_works_from_any_directory(tmp_path, subdir):
    site = _installed_copy(tmp_path, "STALE INSTALLED COPY")
    proc = run_tool(ROOT / subdir, "list", extra_path=site)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == run_tool(ROOT, "list").stdout


def test_installed_tool_works_from_the_work_repo(tmp_path):
    work = ROOT / ".rebase" / "work"
    if not (work / ".git").exists():
        pytest.skip("no .rebase/work in this checkout (python -m tools.rebase apply creates it)")
    site = _installed_copy(tmp_path, "STALE INSTALLED COPY")
    proc = run_tool(work / "megatron" / "core", "list", extra_path=site)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == run_tool(ROOT, "list").stdout


def _installed_copy(tmp_path, marker):
    """A stand-in for site-packages holding an (older) installed copy of the tool."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "tools", site / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    cli = site / "tools" / "rebase" / "cli.py"
    cli.write_text(cli.read_text().replace("def main(argv=None) -> int:\n",
                                           f"def main(argv=None) -> int:\n    print({marker!r})\n", 1))
    return site


def test_installed_copy_hands_over_to_the_checkouts_own_tool(tmp_path):
    site = _installed_copy(tmp_path, "STALE INSTALLED COPY")
    inside = ROOT / "tests" / "unit_tests"
    proc = run_tool(inside, "list", extra_path=site)
    assert proc.returncode == 0, proc.stderr
    assert "STALE INSTALLED COPY" not in proc.stdout
    assert proc.stdout == run_tool(ROOT, "list").stdout


def test_installed_copy_runs_itself_outside_any_checkout(tmp_path):
    site = _installed_copy(tmp_path, "INSTALLED COPY")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    proc = run_tool(outside, "list", extra_path=site)
    assert "INSTALLED COPY" in proc.stdout
    assert proc.returncode == 2
    assert "no upstream.toml and patches/ found" in proc.stderr


def test_an_editable_install_runs_the_checkouts_tool_as_megatron_rebase(tmp_path):
    """An editable install maps ``megatron_rebase`` onto this checkout's tools/rebase (here: a link
    in a stand-in site-packages); its modules import ``tools.rebase``, which the launcher then finds
    in the checkout, from a folder outside any checkout and with -I (no cwd or PYTHONPATH)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "megatron_rebase").symlink_to(ROOT / "tools" / "rebase", target_is_directory=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    launch = (f"import sys; sys.path.insert(0, {str(site)!r}); from megatron_rebase.launch import main; "
              f"sys.exit(main(['-C', {str(ROOT)!r}, 'list']))")
    proc = subprocess.run([sys.executable, "-I", "-c", launch], cwd=outside, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == run_tool(ROOT, "list").stdout
