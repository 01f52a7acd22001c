"""``prove`` gives the same verdicts in a venv where a copy of the fork is installed.

The install is made the way ``pip install -e .`` makes one: a ``.pth`` file in the venv's
site-packages that puts an import hook on ``sys.meta_path`` resolving ``megatron`` to a copy of
the whole stack. Without isolation a patch's tests would import that copy instead of the scratch
stack built without the patch, and a needed patch would look unproven.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from tests.tools.proof.test_prove import _fork_with_scratch, TESTS
from tests.tools.bumpkit import quiet, replace_line
from tools.rebase.proof.isolation import isolated_env
from tools.rebase.proof.prove import prove
from tools.rebase.proof.testrun import run_pytest

_FINDER = '''\
"""A stand-in for setuptools' editable-install finder: megatron comes from {copy!r}."""
import importlib.machinery
import sys


class _InstalledFork:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname == "megatron":
            return importlib.machinery.PathFinder.find_spec(fullname, [{copy!r}])
        return None


def install():
    sys.meta_path.insert(0, _InstalledFork)
'''


def _venv_with_installed_fork(tmp_path, megatron_dir):
    """A venv that sees this venv's packages (pytest) and has ``megatron_dir`` "installed"."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    copy = tmp_path / "installed"
    shutil.copytree(megatron_dir, copy / "megatron")
    with open(os.path.join(site, "_installed_fork.py"), "w") as f:
        f.write(_FINDER.format(copy=str(copy)))
    with open(os.path.join(site, "zz_installed_fork.pth"), "w") as f:
        f.write(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
        f.write("import _installed_fork; _installed_fork.install()\n")
    return python, copy


@pytest.fixture
def fork(tmp_path, monkeypatch):
    fork = _fork_with_scratch(tmp_path, monkeypatch)
    (fork.root / "tests" / "test_alpha.py").write_text(TESTS["tests/test_alpha.py"])
    fork.stack([
        ("alpha-seventy", {"megatron/core/alpha.py": replace_line("return 7", "return 70")},
         None, "Why.", "tests/test_alpha.py::test_not_seven"),
        ("alpha-seventy-one", {"megatron/core/alpha.py": replace_line("return 70", "return 71")},
         None, "Why.", "tests/test_alpha.py::test_seventy_one"),
    ])
    return fork


def _verdicts(fork):
    return {p.name: (p.verdict, p.failed) for p in prove(fork.layout, log=quiet)}


def test_an_installed_fork_does_not_change_the_verdicts(fork, tmp_path, monkeypatch):
    plain = _verdicts(fork)
    assert plain == {"alpha-seventy": ("proven", 1), "alpha-seventy-one": ("proven", 1)}

    python, copy = _venv_with_installed_fork(tmp_path, fork.root / "megatron")
    # The install is live: a plain interpreter there, even with the tree first on PYTHONPATH
    # and as its working directory, imports the installed copy.
    probe = "import megatron.core.alpha as a; print(a.__file__)"
    seen = subprocess.run([str(python), "-c", probe], cwd=fork.root, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(fork.root)), check=True).stdout
    assert seen.startswith(str(copy)), seen
    # ... and an isolated one imports the tree.
    seen = subprocess.run([str(python), "-c", probe], cwd=fork.root, capture_output=True, text=True,
                          env=isolated_env(fork.root, tmp_path / "shim"), check=True).stdout
    assert seen.startswith(str(fork.root.resolve() / "megatron")), seen

    monkeypatch.setattr(sys, "executable", str(python))
    assert _verdicts(fork) == plain
    # The bump's test runner (testrun) is isolated too.
    assert run_pytest(fork.root, ["tests/test_alpha.py::test_seventy_one"]) == {
        "tests/test_alpha.py::test_seventy_one": "passed"}
    (copy / "megatron" / "core" / "alpha.py").write_text("def value():\n    return 71\n")
    (fork.root / "megatron" / "core" / "alpha.py").write_text("def value():\n    return 7\n")
    assert run_pytest(fork.root, ["tests/test_alpha.py::test_seventy_one"]) == {
        "tests/test_alpha.py::test_seventy_one": "failed"}


def test_children_of_the_tests_are_isolated_too(tmp_path):
    """A spawned rank or a ``subprocess`` test inherits the isolation (and a shadowed
    ``sitecustomize`` still runs)."""
    tree = tmp_path / "tree"
    (tree / "megatron").mkdir(parents=True)
    (tree / "megatron" / "__init__.py").write_text("WHERE = 'tree'\n")
    installed = tmp_path / "installed_megatron"
    installed.mkdir()
    python, copy = _venv_with_installed_fork(tmp_path, installed)
    (copy / "megatron" / "__init__.py").write_text("WHERE = 'installed'\n")
    other_site = tmp_path / "other"
    other_site.mkdir()
    (other_site / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_RAN'] = '1'\n")
    env = isolated_env(tree, tmp_path / "shim")
    env["PYTHONPATH"] += os.pathsep + str(other_site)
    child = textwrap.dedent("""
        import os, subprocess, sys
        import megatron
        inner = subprocess.run([sys.executable, "-c", "import megatron; print(megatron.WHERE)"],
                               capture_output=True, text=True, check=True).stdout.strip()
        print(megatron.WHERE, inner, os.environ.get("SHADOWED_RAN"))
    """)
    out = subprocess.run([str(python), "-c", child], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["tree", "tree", "1"]


def test_the_shim_runs_cleanly_in_a_plain_interpreter(tmp_path):
    """Python reports an exception in sitecustomize and goes on without it: that would silently
    drop the isolation, so the shim must run without one (here no .pth has imported anything)."""
    tree = tmp_path / "tree"
    (tree / "megatron").mkdir(parents=True)
    (tree / "megatron" / "__init__.py").write_text("")
    # (-c and -m put the working directory in front after start-up; prove runs in the tree)
    proc = subprocess.run([sys.executable, "-c", "import sys; print([p for p in sys.path if p][0])"],
                          cwd=tmp_path,
                          env=isolated_env(tree, tmp_path / "shim"), capture_output=True, text=True)
    assert proc.returncode == 0 and "Error in sitecustomize" not in proc.stderr, proc.stderr
    assert proc.stdout.strip() == str(tree.resolve())
