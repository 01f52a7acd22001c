"""The TE benchmark's bookkeeping, on made-up windows (no GPU): which groups a selection runs,
the ratio interval, the clock correlation that tells whether window shifts follow the GPU, and
the pooling of several GPUs' rounds (also end to end, on CPU with simulated devices)."""

import json
import math
import sys
from pathlib import Path

import pytest

from bench import te_bench


def window(ms, clock=None):
    return {"step_times_ms": list(ms), "peak_gib": 1.0, "steady_gib": 1.0,
            "gpu_state": {"sm_clock_mhz": clock} if clock else {}}  # fmt: skip


def test_a_plain_name_selects_its_recompute_twin_unless_recompute_is_left_out():
    both = te_bench.groups_for(["mhc"])
    assert both == [["fork", "fork+mhc"], ["fork/rc", "fork+mhc/rc"]]
    assert te_bench.groups_for(["mhc"], recompute=False) == [["fork", "fork+mhc"]]
    # An exact /rc name still selects only that comparison's group.
    assert te_bench.groups_for(["mhc/rc"], recompute=True) == [["fork/rc", "fork+mhc/rc"]]


def test_blocks_of_two_run_only_when_named():
    plain, rc = te_bench.groups_for(None)
    assert "fork+mhc+sel2" not in plain and "fork+mhc+sel" in plain and "upstream/rc" in rc
    assert te_bench.groups_for(["mhc+sel2"]) == [["fork", "fork+mhc+sel2"]]


def test_ratio_interval_is_the_geometric_mean_with_a_t_interval():
    mean, low, high = te_bench.ratio_interval([1.1, 1.2, 1.0])
    assert mean == pytest.approx(math.exp((math.log(1.1) + math.log(1.2)) / 3))
    assert low < mean < high
    # One round: no interval.
    single = te_bench.ratio_interval([1.1])
    assert single[0] == pytest.approx(1.1) and math.isnan(single[1]) and math.isnan(single[2])


def test_clock_correlation_is_negative_when_slow_windows_ran_at_low_clocks():
    windows = {"0": {"fork": [window([150, 152], 1980), window([180, 181], 1600), window([160], 1850)],
                     "upstream": [window([150]), window([151])]}}  # fmt: skip
    corr = te_bench.clock_correlations(windows)
    assert corr["fork@gpu0"] < -0.99
    assert corr["upstream@gpu0"] is None  # never read: no figure rather than a made-up one


def test_clock_correlation_needs_a_clock_that_moved():
    windows = {"0": {"fork": [window([150], 1980), window([170], 1980), window([160], 1980)]}}
    assert te_bench.clock_correlations(windows) == {"fork@gpu0": None}


def test_clock_note_names_the_clock_only_when_read():
    assert te_bench.clock_note(window([1], 1755)) == "@1755MHz"
    assert te_bench.clock_note(window([1])) == ""


def test_fork_root_defaults_to_this_checkout_and_must_hold_megatron_core(tmp_path):
    class Args:
        fork_root = None

    assert te_bench.fork_root(Args()) == te_bench.ROOT.resolve()
    Args.fork_root = str(tmp_path)
    with pytest.raises(SystemExit, match=f"--fork-root {tmp_path} holds no megatron/core"):
        te_bench.fork_root(Args())
    (tmp_path / "megatron" / "core").mkdir(parents=True)
    assert te_bench.fork_root(Args()) == tmp_path.resolve()


def test_rounds_of_several_gpus_pool_ratios_formed_within_each_gpu():
    """With --nproc N each GPU runs its own copy of a group; a ratio pairs two windows of the same
    GPU and round, so a GPU that is 50% slower (and holds twice the memory) shifts no ratio. Only
    one-GPU machines have been lent so far: this is the multi-GPU bookkeeping on made-up windows."""

    def at(ms, peak):
        return {**window(ms), "peak_gib": peak, "steady_gib": peak}

    per_gpu = {
        "0": {"fork": [at([100, 102], 1.0), at([104], 1.0)], "fork+mhc": [at([110, 112.2], 1.3), at([114.4], 1.3)]},
        "1": {"fork": [at([150], 2.0), at([156], 2.0)], "fork+mhc": [at([165], 2.6), at([171.6], 2.6)]},
    }  # fmt: skip
    rows = {r["comparison"]: r for r in te_bench.summarize(per_gpu)}
    assert set(rows) == {"mhc"}
    mhc = rows["mhc"]
    assert mhc["rounds"] == 4
    for value in mhc["step_ratio"]:
        assert value == pytest.approx(1.1)
    assert mhc["peak_ratio"] == pytest.approx(1.3) and mhc["steady_ratio"] == pytest.approx(1.3)
    assert mhc["a_step_ms"] == pytest.approx((104 + 150) / 2)  # median of the four A windows


@pytest.mark.slow
def test_worker_process_group_needs_no_port():
    """A bench worker's one-rank group meets through a process-local store: with MASTER_PORT
    naming a port another process already listens on (what ended a bench on the H200, a port
    picked ahead of time taken before the worker bound it), it still starts."""
    import os
    import socket
    import subprocess
    import sys

    root = Path(te_bench.__file__).resolve().parents[1]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(taken.getsockname()[1])}
        env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
        code = (
            "import torch; from bench.worker import setup_distributed; setup_distributed('cpu')(1234); "
            "print('world', torch.distributed.get_world_size())"
        )
        child = subprocess.run(
            [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300
        )
    assert child.returncode == 0, child.stderr[-3000:]
    assert "world 1" in child.stdout


@pytest.mark.slow
def test_nproc_runs_a_copy_of_each_group_per_device_and_pools_their_rounds(tmp_path):
    """End to end on CPU with two simulated devices (``--device cpu --nproc 2``): four worker
    processes (two configurations x two devices) on a tiny local-spec model, rounds interleaved
    per device, and one row pooling both devices' rounds."""
    out = tmp_path / "bench.json"
    argv = ["--device", "cpu", "--spec", "local", "--layers", "1", "--hidden", "32", "--heads", "2",
            "--seq", "16", "--batch", "1", "--vocab", "64", "--steps", "1", "--rounds", "2",
            "--warmup-max", "2", "--warmup-window", "1", "--lead-in", "0", "--only", "mhc",
            "--no-recompute", "--nproc", "2", "--log-dir", str(tmp_path), "--json", str(out)]  # fmt: skip
    assert te_bench.main(argv) == 0
    payload = json.loads(out.read_text())
    assert payload["meta"]["gpus"] == 2
    assert set(payload["windows"]) == {"0", "1"}
    for device in payload["windows"].values():
        assert {name: [w["round"] for w in ws] for name, ws in device.items()} == {
            "fork": [0, 1], "fork+mhc": [0, 1]}
    (row,) = payload["rows"]
    assert row["comparison"] == "mhc" and row["rounds"] == 4
    # Every worker logged under its own device.
    logs = {p.name for p in tmp_path.rglob("worker-*.log")}
    assert logs == {f"worker-{te_bench.safe_name(n)}-gpu{d}.log" for n in ("fork", "fork+mhc") for d in (0, 1)}


@pytest.mark.slow
def test_floor_stand_in_runs_in_its_worker_only(tmp_path):
    """``fork+mhc-floor`` (opt-in) runs the mHC model with bench/experiments/mhc_floor.py's functions, and only
    its worker: the ready records name the module whose mHC functions ran."""
    assert "fork+mhc-floor" not in {name for group in te_bench.groups_for(None) for name in group}
    out = tmp_path / "bench.json"
    argv = ["--device", "cpu", "--spec", "local", "--layers", "1", "--hidden", "32", "--heads", "2",
            "--seq", "16", "--batch", "1", "--vocab", "64", "--steps", "1", "--rounds", "1",
            "--warmup-max", "2", "--warmup-window", "1", "--lead-in", "0", "--only", "mhc-vs-floor",
            "--no-recompute", "--log-dir", str(tmp_path), "--json", str(out)]  # fmt: skip
    assert te_bench.main(argv) == 0
    ready = json.loads(out.read_text())["ready"]
    assert {name: r["mhc_functions"] for name, r in ready.items()} == {
        "fork+mhc": "megatron.core.transformer.hyper_connection_fused",
        "fork+mhc-floor": "bench.experiments.mhc_floor",
    }


def test_mhc_functions_names_a_kernels_only_module(monkeypatch):
    """The upstream-dev line's hyper_connection_fused holds only kernels (no ``mhc_input``): the
    worker names the module instead of dying before its READY line."""
    import types

    from bench import te_worker

    kernels_only = types.ModuleType("megatron.core.transformer.hyper_connection_fused")
    monkeypatch.setitem(sys.modules, kernels_only.__name__, kernels_only)
    import megatron.core.transformer as transformer_package

    monkeypatch.setattr(transformer_package, "hyper_connection_fused", kernels_only, raising=False)
    assert te_worker.mhc_functions_module() == "megatron.core.transformer.hyper_connection_fused"

    def mhc_input():
        pass

    mhc_input.__module__ = "bench.experiments.mhc_floor"
    kernels_only.mhc_input = mhc_input
    assert te_worker.mhc_functions_module() == "bench.experiments.mhc_floor"
