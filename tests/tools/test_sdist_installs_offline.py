"""``python -m build`` makes an sdist that installs offline as the patched package."""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("build", reason="needs the 'build' package (in the [dev] extra)")


def run(*cmd, cwd, env=None):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    if not (ROOT / "megatron" / "core").is_dir():
        pytest.skip("megatron/ is not materialized in this checkout (python -m tools.rebase apply)")
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", out, ".", cwd=ROOT)
    (archive,) = out.glob("*.tar.gz")
    return archive


@pytest.mark.slow
def test_sdist_carries_the_patched_package_and_no_stack(sdist):
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    top = names[0].split("/", 1)[0]
    assert f"{top}/megatron/core/cpu_harness.py" in names            # a fork-only module
    assert f"{top}/PKG-INFO" in names
    assert not any(n.startswith(f"{top}/patches/") for n in names)


@pytest.mark.slow
def test_sdist_installs_offline_as_the_patched_package(sdist, tmp_path):
    target = tmp_path / "site"
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("FORK_REBASE_CACHE", None)
    run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
        "--target", target, sdist, cwd=tmp_path, env=env)
    probe = ("import megatron.core as m, megatron.core.cpu_harness as h; "
             "print(m.__version__); print(m.__file__)")
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = run(sys.executable, "-c", probe, cwd=tmp_path, env=dict(clean, PYTHONPATH=str(target)))
    version, where = out.split()
    assert "+rl." in version
    assert Path(where).is_relative_to(target)
    # The tool is installed with all its layer packages and its data file.
    probe = ("import tools.rebase.cli, tools.rebase.bump.bump, tools.rebase.git.gitcmd as g; "
             "print(g.__file__); print(g._ATTRIBUTES.is_file())")
    where, shipped = run(sys.executable, "-c", probe, cwd=tmp_path, env=dict(clean, PYTHONPATH=str(target))).split()
    assert Path(where).is_relative_to(target) and shipped == "True"
