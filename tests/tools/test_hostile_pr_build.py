"""Issue 46, item 2: ``pip install .`` builds only what setup.py names. A committed ``build/lib``
(its files would be copied into the wheel), ``dist/`` or ``*.egg-info`` is refused by the tool's
apply (which the build runs) and by ``check``; one an unpacked archive carries is never read, since
setuptools builds in a private temporary folder; a ``setup.cfg`` or ``MANIFEST.in`` is refused."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.tools.hostile import REPO_ROOT, committed_fork, pull_request, tool, tool_env, unpacked_archive

SITECUSTOMIZE = "open({marker!r}, 'w').write('ran')\n"


def buildable_fork(tmp_path):
    """The synthetic fork with this repository's setup.py, pyproject.toml and tools/ (the
    maintainer's code: a data-only pull request changes none of them)."""
    fork = committed_fork(tmp_path)
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy(REPO_ROOT / name, fork.root / name)
    shutil.copytree(REPO_ROOT / "tools", fork.root / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    (fork.root / "README.md").write_text("# fork\n")
    subprocess.run(["git", "add", "-A"], cwd=fork.root, check=True)
    subprocess.run(["git", "-c", "user.name=m", "-c", "user.email=m@example.invalid", "commit", "-qm", "build"],
                   cwd=fork.root, check=True)
    return fork


def pip_wheel(checkout: Path, tmp_path: Path, env=None):
    out = tmp_path / "wheels"
    env = tool_env({"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", **(env or {})}, cache=tmp_path / "cache")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(checkout)], cwd=tmp_path, env=env, capture_output=True, text=True)
    return proc, sorted(out.glob("*.whl"))


def _payload(marker, where="build/lib/sitecustomize.py"):
    def payload(pr):
        (pr / where).parent.mkdir(parents=True, exist_ok=True)
        (pr / where).write_text(SITECUSTOMIZE.format(marker=str(marker)))
    return payload


@pytest.mark.parametrize("where", ["build/lib/sitecustomize.py", "dist/x.txt",
                                   "megatron_core.egg-info/SOURCES.txt"])
def test_committed_build_output_is_refused_naming_it(tmp_path, where):
    fork = buildable_fork(tmp_path)
    marker = tmp_path / "MARKER"
    ci = pull_request(fork, tmp_path, _payload(marker, where))
    proc, wheels = pip_wheel(ci, tmp_path)
    assert proc.returncode != 0 and not wheels
    assert where in proc.stdout + proc.stderr and "build output" in proc.stdout + proc.stderr
    proc = tool(ci, "check", cache=tmp_path / "cache")
    assert proc.returncode != 0 and where in proc.stderr
    assert not marker.exists()


def test_an_archives_build_folder_never_reaches_the_wheel(tmp_path):
    fork = buildable_fork(tmp_path)
    marker = tmp_path / "MARKER"
    ci = pull_request(fork, tmp_path, _payload(marker))
    unpacked = unpacked_archive(tmp_path, ci, keep=lambda rel: False)
    assert (unpacked / "build" / "lib" / "sitecustomize.py").is_file()
    proc, wheels = pip_wheel(unpacked, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert "megatron/core/beta.py" in names and "megatron_rebase/cli.py" in names
    assert not [n for n in names if "sitecustomize" in n]
    assert not marker.exists()
    assert sorted(os.listdir(unpacked / "build")) == ["lib"]  # nothing was built there


@pytest.mark.parametrize("name", ["setup.cfg", "MANIFEST.in"])
def test_a_setuptools_input_the_fork_does_not_have_is_refused(tmp_path, name):
    fork = buildable_fork(tmp_path)
    text = "[options]\ndata_files =\n  lib = sitecustomize.py\n" if name == "setup.cfg" else "include sitecustomize.py\n"
    ci = pull_request(fork, tmp_path, lambda pr: (pr / name).write_text(text))
    proc, wheels = pip_wheel(ci, tmp_path)
    assert proc.returncode != 0 and not wheels
    assert name in proc.stdout + proc.stderr and "refusing to build" in proc.stdout + proc.stderr
