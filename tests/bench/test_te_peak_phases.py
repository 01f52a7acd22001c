"""Where a step's memory peaks: the allocator-history replay (bench/memory_trace.py) on made-up
events, and bench/te_peak_phases.py end to end on CPU (its phase records and its errors)."""

import json

import pytest

from bench import te_peak_phases
from bench.memory_trace import peak_of_trace, site_of

MiB = 2**20


def frame(path, line, name):
    return {"filename": path, "line": line, "name": name}


def alloc(addr, mib, *frames):
    return {"action": "alloc", "addr": addr, "size": mib * MiB, "frames": list(frames)}


def free(addr, mib, action="free_requested"):
    return {"action": action, "addr": addr, "size": mib * MiB, "frames": []}


LOSS = frame("/x/megatron/core/models/gpt/gpt_model.py", 400, "compute_language_model_loss")
ATTN = frame("/x/megatron/core/transformer/attention.py", 90, "forward")
TORCH = frame("/usr/lib/torch/nn/functional.py", 10, "linear")


def test_site_is_the_innermost_megatron_frame():
    assert site_of([TORCH, ATTN, LOSS]) == "megatron/core/transformer/attention.py:90 forward"
    assert site_of([TORCH]) == "/usr/lib/torch/nn/functional.py:10 linear"
    assert site_of([]) == "no Python frame"


def test_peak_is_found_and_what_was_live_then_is_grouped_by_site():
    events = [
        # The allocator reserving a segment from the driver is not an allocation of tensors.
        {"action": "segment_alloc", "addr": 1000, "size": 2048 * MiB, "frames": []},
        alloc(1, 100, TORCH, ATTN),
        alloc(2, 50, ATTN),
        free(2, 50),
        free(2, 50, "free_completed"),  # the deferred half of the same free: counted once
        alloc(3, 300, LOSS),  # the peak: 400 MiB live
        free(3, 300),
        alloc(4, 200, ATTN),  # 300 MiB: below the peak
        free(9, 64),  # a block from before the history: leaves the count, was never live here
    ]
    got = peak_of_trace(events)
    assert got["peak_event"] == 5
    assert got["peak_above_start_gib"] == round(400 / 1024, 4)
    assert got["allocation_at_peak"] == "megatron/core/models/gpt/gpt_model.py:400 compute_language_model_loss"
    assert got["live_at_peak_by_site_gib"] == [
        ["megatron/core/models/gpt/gpt_model.py:400 compute_language_model_loss", round(300 / 1024, 4)],
        ["megatron/core/transformer/attention.py:90 forward", round(100 / 1024, 4)],
    ]


def test_a_late_peak_counts_frees_once_even_when_deferred():
    # Counting the deferred free_completed a second time would put the peak at the first alloc.
    events = [alloc(1, 100, ATTN), free(1, 100), free(1, 100, "free_completed"), alloc(2, 60, ATTN),
              alloc(3, 60, LOSS)]  # fmt: skip
    got = peak_of_trace(events)
    assert got["peak_event"] == 4 and got["peak_above_start_gib"] == round(120 / 1024, 4)


def test_an_empty_history_is_an_error_that_says_why():
    with pytest.raises(ValueError, match="no events"):
        peak_of_trace([])


def test_unknown_configuration_is_named():
    with pytest.raises(SystemExit, match="fork/rcc"):
        te_peak_phases.main(["--device", "cpu", "--configs", "fork/rcc"])


def test_upstream_configuration_needs_an_upstream_tree(tmp_path):
    with pytest.raises(SystemExit, match="--upstream"):
        te_peak_phases.main(["--device", "cpu", "--configs", "upstream/rc", "--upstream", str(tmp_path)])


def test_trace_is_refused_without_cuda():
    with pytest.raises(SystemExit, match="--trace needs --device cuda"):
        te_peak_phases.main(["--device", "cpu", "--configs", "fork", "--trace"])


@pytest.mark.slow
def test_phases_run_each_configuration_in_its_own_worker_on_cpu(tmp_path):
    """End to end on CPU with a tiny local-spec model: one worker per configuration, the phase
    record of every measured step (CPU has no allocator counters, so only the record's shape and
    the tree it ran on can be checked here; the GPU run fills the figures)."""
    out = tmp_path / "phases.json"
    argv = ["--device", "cpu", "--spec", "local", "--layers", "1", "--hidden", "32", "--heads", "2",
            "--seq", "16", "--batch", "1", "--vocab", "64", "--configs", "fork", "fork+mhc/rc",
            "--phase-steps", "2", "--log-dir", str(tmp_path), "--json", str(out)]  # fmt: skip
    assert te_peak_phases.main(argv) == 0
    configs = json.loads(out.read_text())["configs"]
    assert list(configs) == ["fork", "fork+mhc/rc"]
    for result in configs.values():
        assert len(result["steps"]) == 2
        assert set(result["steps"][0]) == {"start_gib", "after_backward_gib"}
        assert result["megatron"].endswith("megatron/core/__init__.py")
