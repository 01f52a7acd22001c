"""``python -m build`` makes an sdist that installs offline as the patched package, and its
wheel installs the tool as ``megatron_rebase`` (no top-level ``tools`` package)."""

import os
import re
import subprocess
import sys
import tarfile
import zipfile
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
    # The tool is installed as megatron_rebase with all its layer packages and its data file, and
    # site-packages gets no top-level `tools` package.
    probe = ("import megatron_rebase.cli, megatron_rebase.bump.bump, megatron_rebase.git.gitcmd as g; "
             "print(g.__file__); print(g._ATTRIBUTES.is_file())")
    where, shipped = run(sys.executable, "-c", probe, cwd=tmp_path, env=dict(clean, PYTHONPATH=str(target))).split()
    assert Path(where).is_relative_to(target) and shipped == "True"
    assert not (target / "tools").exists()


@pytest.fixture(scope="module")
def wheel(sdist, tmp_path_factory):
    """The wheel pip builds from the sdist (as `pip install` of the sdist does)."""
    out = tmp_path_factory.mktemp("wheel")
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.setdefault("FORK_REBASE_CACHE", str(tmp_path_factory.mktemp("cache")))
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out, sdist,
        cwd=out, env=env)
    (built,) = out.glob("*.whl")
    return built


def test_the_wheel_has_no_top_level_tools_package(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        tops = {n.split("/", 1)[0] for n in names}
        assert "tools" not in tops and "megatron_rebase" in tops and "megatron" in tops, tops
        assert {"megatron_rebase/cli.py", "megatron_rebase/launch.py", "megatron_rebase/git/gitattributes",
                "megatron_rebase/bump/bump.py"} <= set(names)
        # Every import of the tool's own modules names the installed package.
        stale = [n for n in names if n.startswith("megatron_rebase/") and n.endswith(".py")
                 and re.search(r"^\s*(from|import)\s+tools\.rebase\b", z.read(n).decode(), re.M)]
        assert stale == []
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "megatron-rebase = megatron_rebase.launch:main" in z.read(entry_points).decode()


def test_the_installed_tool_runs_on_a_checkout_like_the_checkouts_own(wheel, tmp_path):
    target = tmp_path / "site"
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, wheel, cwd=tmp_path, env=env)
    assert not (target / "tools").exists()
    # -I: as a console script runs, with neither the current folder nor PYTHONPATH on the path.
    launch = (f"import sys; sys.path.insert(0, {str(target)!r}); from megatron_rebase.launch import main; "
              f"sys.exit(main(['-C', {str(ROOT)!r}, 'list']))")
    installed = run(sys.executable, "-I", "-c", launch, cwd=tmp_path)
    assert installed == run(sys.executable, "-m", "tools.rebase", "list", cwd=ROOT)
    assert "| 0001 |" in installed
