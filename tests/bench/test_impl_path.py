"""A benchmark worker measures the implementation it was started for.

The bug this guards: workers start as ``python -m bench.<worker>`` from the checkout's root, so the
checkout's ``megatron/`` (the fork) came first on ``sys.path`` and every "upstream" worker measured
the fork. These tests start interpreters the same way (cwd = the checkout, ``-c``/``-m`` put it
first on the path) with a stand-in upstream tree.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import te_bench
from bench.impl_path import ENV

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def other_tree(tmp_path):
    core = tmp_path / "megatron" / "core"
    core.mkdir(parents=True)
    (core / "__init__.py").write_text("__version__ = 'stand-in'\n")
    return tmp_path


def run_from_checkout(code, tree, extra_env=None):
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(ROOT)])
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


@pytest.mark.slow
def test_without_the_guard_the_checkouts_own_megatron_wins(other_tree):
    # The condition the guard exists for (needs the checkout's materialized megatron/).
    if not (ROOT / "megatron" / "core" / "__init__.py").is_file():
        pytest.skip("no materialized megatron/ in this checkout")
    out = run_from_checkout("import megatron.core as m; print(m.__file__)", other_tree)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).resolve().is_relative_to(ROOT / "megatron")


def test_the_worker_imports_the_tree_the_driver_named(other_tree):
    code = "from bench.impl_path import import_megatron_from_env as f; m = f(); print(m.__version__, m.__file__)"
    out = run_from_checkout(code, other_tree, {ENV: str(other_tree)})
    assert out.returncode == 0, out.stderr
    version, path = out.stdout.split()
    assert version == "stand-in" and Path(path).resolve().is_relative_to(other_tree.resolve())


@pytest.mark.slow
def test_a_megatron_imported_earlier_from_elsewhere_stops_the_worker(other_tree):
    if not (ROOT / "megatron" / "core" / "__init__.py").is_file():
        pytest.skip("no materialized megatron/ in this checkout")
    code = "import megatron.core; from bench.impl_path import import_megatron_from_env as f; f()"
    out = run_from_checkout(code, other_tree, {ENV: str(other_tree)})
    assert out.returncode != 0
    assert f"benchmark worker for {other_tree.resolve()} imported megatron.core from {ROOT}" in out.stderr


def test_a_root_without_megatron_core_is_refused(tmp_path):
    out = run_from_checkout("from bench.impl_path import import_megatron_from_env as f; f()", tmp_path,
                            {ENV: str(tmp_path)})  # fmt: skip
    assert out.returncode != 0 and f"{ENV}={tmp_path.resolve()}: no megatron/core/__init__.py" in out.stderr


def test_both_drivers_name_the_tree_for_their_workers(other_tree, monkeypatch):
    env = te_bench.worker_env(other_tree)
    assert env[ENV] == str(other_tree)
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(other_tree), str(te_bench.ROOT)]
    from bench import fork_vs_upstream

    seen = {}

    class Recorder:
        def __init__(self, cmd, cwd, env, **kwargs):
            seen.update(cmd=cmd, env=env)

    monkeypatch.setattr(fork_vs_upstream.subprocess, "Popen", Recorder)
    class Args:
        device = "cpu"

    fork_vs_upstream.start_worker(other_tree, "upstream", "plain", Args())
    assert seen["env"][ENV] == str(other_tree)


@pytest.mark.slow
def test_te_bench_upstream_worker_runs_pristine_upstream(tmp_path):
    """End to end on the CPU: the driver's ready records name each implementation's own tree."""
    import json

    from bench import fork_vs_upstream

    try:
        upstream = fork_vs_upstream.upstream_tree(tmp_path)
    except Exception as e:  # no cached sdist and no index: nothing to compare against
        pytest.skip(f"pinned upstream sdist not obtainable here: {e}")
    out_json = tmp_path / "bench.json"
    cmd = [sys.executable, "bench/te_bench.py", "--device", "cpu", "--spec", "local", "--layers", "1",
           "--hidden", "64", "--heads", "4", "--seq", "32", "--batch", "1", "--vocab", "128", "--steps", "1",
           "--rounds", "2", "--warmup-max", "2", "--warmup-window", "1", "--only", "fork-vs-upstream",
           "--dispatcher", "allgather",  # upstream's alltoall dispatcher opens a CUDA stream
           "--no-recompute", "--upstream", str(upstream), "--log-dir", str(tmp_path), "--json", str(out_json)]  # fmt: skip
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    ready = json.loads(out_json.read_text())["ready"]
    assert Path(ready["upstream"]["megatron"]).resolve().is_relative_to(upstream.resolve())
    assert Path(ready["fork"]["megatron"]).resolve().is_relative_to(ROOT / "megatron")
    assert "+rl." in ready["fork"]["version"] and "+rl." not in ready["upstream"]["version"]
