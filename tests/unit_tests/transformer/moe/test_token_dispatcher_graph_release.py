"""The MoE token dispatcher must not keep a forward's autograd graph alive after backward.

The allgather dispatcher cached its routing probabilities (``local_probs``, a tensor of the
autograd graph) on the dispatcher until the next forward. Under full activation recompute the
recomputed graph's leaves are the checkpoint's detached inputs, which share the storage of the
checkpoint's input, so every layer pinned its checkpoint input (and the graph) for a whole
iteration. These tests look at the CPU allocator itself (profiler memory events) over several
iterations and never hold a reference to the tensors they watch.
"""

import gc
import json
import os
import tempfile

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import (
    build_gpt,
    causal_batch,
    tiny_moe_mtp_config,
)
from tests.unit_tests.test_utilities import Utils, run_distributed, unit_device

FULL_RECOMPUTE = dict(
    recompute_granularity="full",
    recompute_method="uniform",
    recompute_num_layers=1,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)
ITERATIONS = 3


def _allocator_events(trace_path):
    """(timestamp, kind, payload) for allocator events and our marks, in time order."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    out = []
    for e in events:
        name = e.get("name", "")
        if name == "[memory]":
            out.append((e["ts"], "mem", (e["args"]["Addr"], e["args"]["Bytes"])))
        elif name.startswith(("ckpt_input:", "iteration_end:")):
            out.append((e["ts"], "mark", name))
    return sorted(out, key=lambda item: item[0])


def _unreleased_checkpoint_inputs(model, iterations):
    """Run ``iterations`` training steps under the profiler and return, per iteration, the
    layers whose checkpoint input storage was still allocated when the step had finished."""
    for i, layer in enumerate(model.decoder.layers):

        def hook(mod, args, kwargs, i=i):
            # The checkpoint's own (no-grad) forward sees the checkpoint input; keep only its
            # address, in a mark, so that the test holds no reference to it.
            if not torch.is_grad_enabled():
                ptr = kwargs["hidden_states"].untyped_storage().data_ptr()
                with record_function(f"ckpt_input:{i}:{ptr}"):
                    pass

        layer.register_forward_pre_hook(hook, with_kwargs=True)
    tokens, position_ids, mask = causal_batch()
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            for it in range(iterations):
                model.zero_grad(set_to_none=True)
                model(tokens, position_ids, mask, labels=tokens).mean().backward()
                gc.collect()
                with record_function(f"iteration_end:{it}"):
                    pass
        prof.export_chrome_trace(trace)
        events = _allocator_events(trace)

    live = {}  # address -> index of its current allocation event
    watched = []  # (layer, address, allocation event index) per iteration
    result = []
    for idx, (_, kind, payload) in enumerate(events):
        if kind == "mem":
            addr, nbytes = payload
            if nbytes > 0:
                live[addr] = idx
            else:
                live.pop(addr, None)
        elif payload.startswith("ckpt_input:"):
            _, layer, addr = payload.split(":")
            assert int(addr) in live, "the checkpoint input was not allocated while profiling"
            watched.append((int(layer), int(addr), live[int(addr)]))
        else:
            # Every layer's checkpoint input was watched in this step: an empty result means freed,
            # not "nothing was looked at".
            assert sorted(layer for layer, _, _ in watched) == list(range(len(model.decoder.layers))), watched
            result.append(sorted(layer for layer, addr, at in watched if live.get(addr) == at))
            watched = []
    assert len(result) == iterations
    return result


class TestDispatcherReleasesGraph:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.slow
    def test_checkpoint_inputs_are_freed_by_the_end_of_each_step(self):
        torch.manual_seed(0)
        model = build_gpt(tiny_moe_mtp_config(num_layers=3, **FULL_RECOMPUTE))
        unreleased = _unreleased_checkpoint_inputs(model, ITERATIONS)
        assert unreleased == [[]] * ITERATIONS, (
            f"checkpoint inputs still allocated after each step, per iteration: {unreleased}"
        )

    def test_dispatcher_holds_no_graph_after_backward(self):
        torch.manual_seed(0)
        model = build_gpt(tiny_moe_mtp_config(**FULL_RECOMPUTE))
        tokens, position_ids, mask = causal_batch()
        model(tokens, position_ids, mask, labels=tokens).mean().backward()
        dispatchers = {
            name: mod.token_dispatcher
            for name, mod in model.named_modules()
            if hasattr(mod, "token_dispatcher")
        }
        assert dispatchers
        for name, dispatcher in dispatchers.items():
            for attr, value in vars(dispatcher).items():
                if isinstance(value, torch.Tensor):
                    assert value.grad_fn is None and not value.requires_grad, (
                        f"{name}.token_dispatcher.{attr} keeps the autograd graph alive"
                    )


def _cpu_streams_for_alltoall():
    """The alltoall dispatcher makes a side stream for its device-to-host copies; on CPU (in a
    spawned rank only) that stream is the current one and entering it does nothing."""
    import contextlib

    class _HostStream:
        def record_event(self):
            return self  # an event whose synchronize() returns at once

        def synchronize(self):
            pass

    stream = _HostStream()
    torch.cuda.Stream = lambda *args, **kwargs: stream
    torch.cuda.current_stream = lambda *args, **kwargs: stream
    torch.cuda.stream = lambda s: contextlib.nullcontext()


def _train_step_with_parallel_dispatcher(rank, world_size, dispatcher, sizes):
    """One forward/backward of a tiny MoE GPT whose dispatcher communicates across two ranks:
    the combine then casts to the probs' dtype (``tp > 1 or ep > 1``), the path that needs the
    dtype the dispatcher kept in place of the probs tensor."""

    if dispatcher == "alltoall" and not torch.cuda.is_available():
        _cpu_streams_for_alltoall()
    Utils.initialize_model_parallel(
        tensor_model_parallel_size=sizes.get("tensor_model_parallel_size", 1),
        expert_model_parallel_size=sizes.get("expert_model_parallel_size", 1),
        expert_tensor_parallel_size=sizes.get("expert_tensor_parallel_size", None),
    )
    torch.manual_seed(0)
    config = tiny_moe_mtp_config(
        moe_token_dispatcher_type=dispatcher, mtp_num_layers=None, **sizes
    )
    model = build_gpt(config, with_mtp=False).to(unit_device())
    tokens, position_ids, mask = causal_batch()
    loss = model(tokens, position_ids, mask, labels=tokens)
    assert torch.isfinite(loss).all()
    loss.mean().backward()
    dispatchers = [layer.mlp.token_dispatcher for layer in model.decoder.layers]
    assert all(d.probs_dtype == torch.float32 for d in dispatchers)
    for d in dispatchers:
        held = [a for a, v in vars(d).items() if isinstance(v, torch.Tensor) and v.requires_grad]
        assert not held, f"rank {rank}: the dispatcher holds graph tensors {held}"
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"rank {rank}: no gradient for {missing}"


class TestDispatcherAcrossTwoRanks:
    """tp > 1 / ep > 1 on two spawned gloo ranks (CPU): the combine's dtype cast runs."""

    @pytest.mark.slow
    def test_allgather_with_expert_parallel(self):
        run_distributed(
            _train_step_with_parallel_dispatcher, 2, "allgather",
            dict(expert_model_parallel_size=2, expert_tensor_parallel_size=1),
        )

    @pytest.mark.slow
    def test_alltoall_with_expert_tensor_parallel(self):
        run_distributed(
            _train_step_with_parallel_dispatcher, 2, "alltoall",
            dict(expert_tensor_parallel_size=2),
        )
