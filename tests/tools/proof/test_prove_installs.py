"""``prove`` gives one verdict whether the fork is not installed, installed (``pip install .``) or
installed editable (``pip install -e .``, what contributors use) -- issue 57, item 3.

The defect: with an editable install, a patch that adds a module was reported "unproven (0/3
failed without it)": setuptools' editable finder maps ``megatron.core`` (not ``megatron``) to the
checkout, so the isolation, which only asked import hooks about ``megatron``, kept it, and the
variant tree built without the patch imported the added module from the installed checkout. Here
a toy fork is really installed each way (pip, offline, into a venv of its own) and ``prove`` runs
under that venv's interpreter.
"""

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.tools.bumpkit import make_fork, quiet

REPO_ROOT = Path(__file__).resolve().parents[3]

UPSTREAM = {
    "megatron/core/package_info.py": "MAJOR = 0\nMINOR = 42\nPATCH = 1\nPRE_RELEASE = ''\n",
    "megatron/core/__init__.py": "",
    "megatron/core/alpha.py": "def value():\n    return 7\n",
}
SETUP = ('from setuptools import find_namespace_packages, setup\n'
         'setup(name="toy-fork", version="0.0.1",\n'
         '      packages=find_namespace_packages(include=["megatron.core", "megatron.core.*"]))\n')
HARNESS_TEST = ("from megatron.core import harness\n\n\n"
                "def test_harness_runs():\n    assert harness.run() == 3\n")


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A fork whose one patch adds a module, with ``Tests:`` that import it."""
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork = make_fork(tmp_path, files=UPSTREAM)
    (fork.root / "tests" / "test_harness.py").write_text(HARNESS_TEST)
    (fork.root / "setup.py").write_text(SETUP)
    fork.stack([("cpu-harness", {"megatron/core/harness.py": "def run():\n    return 3\n"},
                 None, "Why.", "tests/test_harness.py::test_harness_runs")])
    assert (fork.root / "megatron" / "core" / "harness.py").is_file()  # apply materialized it
    return fork


def _venv(tmp_path, name) -> Path:
    """A venv that sees this venv's packages (pytest, setuptools) as plain path entries: the
    ``.pth`` files there (this checkout's own editable install) do not run in it."""
    venv = tmp_path / name
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "zz_outer_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _install(python: Path, fork, editable: bool) -> None:
    args = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
            "--no-index", "--no-build-isolation", *(["-e"] if editable else []), str(fork.root)]
    proc = subprocess.run(args, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _harness_seen_from(python: Path, fork, cwd: Path) -> str:
    """Where a plain interpreter of that venv imports the patch's module from ("" when it cannot)."""
    proc = subprocess.run([str(python), "-c", "import megatron.core.harness as h; print(h.__file__)"],
                          cwd=cwd, capture_output=True, text=True)
    return proc.stdout.strip()


def _prove(python: Path, fork) -> tuple:
    proc = subprocess.run([str(python), "-m", "tools.rebase", "-C", str(fork.root), "prove"],
                          cwd=REPO_ROOT, capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("prove: 0001")), proc.stdout + proc.stderr)
    return proc.returncode, line


def test_prove_gives_one_verdict_under_no_plain_and_editable_installs(toy, tmp_path):
    bare = _venv(tmp_path, "bare")
    plain = _venv(tmp_path, "plain")
    _install(plain, toy, editable=False)
    editable = _venv(tmp_path, "editable")
    _install(editable, toy, editable=True)
    # The installs are live: outside the checkout, each venv finds the patch's module where it
    # installed it (the editable one in the checkout itself), the bare venv finds none.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert _harness_seen_from(bare, toy, elsewhere) == ""
    assert "site-packages" in _harness_seen_from(plain, toy, elsewhere)
    assert _harness_seen_from(editable, toy, elsewhere) == str(toy.root / "megatron" / "core" / "harness.py")

    verdicts = {name: _prove(python, toy) for name, python in
                (("none", bare), ("plain", plain), ("editable", editable))}
    expected = (0, "prove: 0001 cpu-harness: proven (1/1 failed without it, 0 with it)")
    assert verdicts == {"none": expected, "plain": expected, "editable": expected}, verdicts
