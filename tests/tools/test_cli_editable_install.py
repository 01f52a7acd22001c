"""The ``megatron-rebase`` command of an editable install (``pip install -e .``, what contributors
use) works from inside the checkout: ``tests/`` (whose ``tools`` is a test package) and
``.rebase/work`` (upstream's tree, with its own ``tools/``). It died there with
``ModuleNotFoundError: No module named 'tools'`` (issue 54, item 6): the launcher took the
checkout for another one, and imported the tool's git helpers before putting the checkout on the
path. Here this checkout is really installed, editable, into a venv of its own."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    if not (ROOT / "megatron" / "core").is_dir():
        pytest.skip("megatron/ is not materialized (python -m tools.rebase apply)")
    venv = tmp_path_factory.mktemp("editable") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # this venv's packages (setuptools for the build) as a plain path: its own .pth files do not run
    Path(site, "zz_outer_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = dict(os.environ, MEGATRON_FORK_SKIP_APPLY="1")  # megatron/ is there: no apply
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                           "--no-index", "--no-build-isolation", "-e", str(ROOT)],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert any(p.name.startswith("__editable__") for p in Path(site).iterdir()), "not an editable install"
    return venv / "bin" / "megatron-rebase"


def _run(command, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MEGATRON_REBASE_IN_CHECKOUT")}
    return subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True)


@pytest.mark.parametrize("subdir", ["tests", "tests/tools", ".rebase/work", ".rebase/work/megatron/core"])
def test_editable_install_launcher_works_inside_the_checkout(launcher, subdir):
    where = ROOT / subdir
    if not where.is_dir():
        pytest.skip(f"no {subdir} in this checkout (python -m tools.rebase apply creates .rebase/work)")
    expected = _run([sys.executable, "-m", "tools.rebase", "list"], ROOT)
    assert expected.returncode == 0, expected.stderr
    proc = _run([launcher, "list"], where)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected.stdout
