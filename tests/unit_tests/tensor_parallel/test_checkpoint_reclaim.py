"""Activation-recompute storage reclaim (``recompute_reclaim_inputs``) by declared ownership.

A checkpoint frees an input's storage after its backward only when its call site declared that
it owns the input (the transformer block's chunk runner does, for the previous chunk's output).
Freeing every input instead (the rule RL frameworks patched in) is a use-after-free with mHC + MTP,
where the MTP checkpoint's input aliases the decoder multistream that the decoder's contraction
still reads; the last test shows that rule crashing or corrupting in a subprocess.
"""

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from megatron.core import tensor_parallel
from megatron.core.transformer import TransformerConfig
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import (
    build_gpt,
    causal_batch,
    tiny_moe_mtp_config,
)
from tests.unit_tests.test_utilities import Utils, unit_device

REPO = Path(__file__).resolve().parents[3]
# The release line's own mHC (patch mhc-hyper-connections). The upstream-dev line drops that patch
# for dev's mHC (enable_hyper_connections), where the same reclaim cases are
# tests/unit_tests/transformer/test_dev_mhc_line.py::TestReclaimWithDevMHC.
FORK_MHC = "enable_mhc_connections" in {f.name for f in dataclasses.fields(TransformerConfig)}
needs_fork_mhc = pytest.mark.skipif(
    not FORK_MHC,
    reason="no fork mHC (enable_mhc_connections) on this base: the upstream-dev line uses dev's "
    "mHC; see test_dev_mhc_line.py::TestReclaimWithDevMHC",
)
RECOMPUTE = dict(
    recompute_granularity="full",
    recompute_method="uniform",
    recompute_num_layers=1,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)


def _stage(weight):
    def run(x):
        return torch.tanh(x @ weight)

    return run


def _chain(weights, x0, reclaim):
    """x0 -> ck -> x1 -> ck -> x2 -> ck -> x3; checkpoints after the first own their input."""
    inputs = [x0]
    x = x0
    for i, w in enumerate(weights):
        owned = (0,) if (reclaim and i > 0) else ()
        x = tensor_parallel.checkpoint(_stage(w), False, x, reclaim_inputs=owned)
        inputs.append(x)
    x.sum().backward()
    return inputs


def _weights(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(8, 8, generator=gen).requires_grad_(True) for _ in range(3)]


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _first_inputs(model, layers):
    """Record the hidden_states each layer first sees: in the (no-grad) checkpoint forward that
    is the checkpoint's own input tensor."""
    seen = {}
    for idx, layer in layers:

        def hook(mod, args, kwargs, idx=idx):
            seen.setdefault(idx, kwargs["hidden_states"])

        layer.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


class TestCheckpointReclaim:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_chain_frees_declared_inputs_with_equal_grads(self):
        x_ref = torch.randn(4, 8, requires_grad=True)
        w_ref = _weights()
        ref = _chain(w_ref, x_ref, reclaim=False)
        assert all(t.untyped_storage().nbytes() > 0 for t in ref)

        x = x_ref.detach().clone().requires_grad_(True)
        w = _weights()
        got = _chain(w, x, reclaim=True)
        assert got[0].untyped_storage().nbytes() > 0, "the undeclared first input must survive"
        assert got[1].untyped_storage().nbytes() == 0
        assert got[2].untyped_storage().nbytes() == 0
        assert got[3].untyped_storage().nbytes() > 0, "the last output is no checkpoint's input"
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=0, atol=0)
        for a, b in zip(w, w_ref):
            torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)

    def test_guards_views_non_grad_and_distributed(self):
        # The distributed checkpoint gathers its input through Megatron's global memory buffer,
        # which lives on the CUDA device where there is one.
        device = unit_device()
        w = torch.randn(8, 8, device=device, requires_grad=True)
        base = torch.randn(4, 8, device=device, requires_grad=True) * 1.0
        view = base[:2]
        distributed = torch.randn(4, 8, device=device, requires_grad=True) * 1.0
        owned = torch.randn(4, 8, device=device, requires_grad=True) * 1.0
        frozen = torch.randn(4, 8, device=device)

        def two(a, b):
            return torch.tanh(a @ w) + b

        outs = [
            tensor_parallel.checkpoint(_stage(w), False, view, reclaim_inputs=(0,)),
            tensor_parallel.checkpoint(_stage(w), True, distributed, reclaim_inputs=(0,)),
            tensor_parallel.checkpoint(two, False, owned, frozen, reclaim_inputs=(0, 1)),
        ]
        sum(o.sum() for o in outs).backward()
        assert base.untyped_storage().nbytes() > 0
        assert distributed.untyped_storage().nbytes() > 0
        assert frozen.untyped_storage().nbytes() > 0
        assert owned.untyped_storage().nbytes() == 0

    def test_detached_input_grads_are_dropped(self):
        w = torch.randn(8, 8, requires_grad=True)
        recomputed = []

        def run(x):
            if torch.is_grad_enabled():  # the recompute in backward gets the detached input
                recomputed.append(x)
            return torch.tanh(x @ w)

        x = torch.randn(4, 8, requires_grad=True)
        tensor_parallel.checkpoint(run, False, x).sum().backward()
        assert len(recomputed) == 1
        assert recomputed[0].grad is None
        assert x.grad is not None and x.grad.abs().sum() > 0

    def test_bad_declaration_is_a_clear_error(self):
        x = torch.randn(2, 8, requires_grad=True)
        try:
            tensor_parallel.checkpoint(_stage(torch.eye(8)), False, x, reclaim_inputs=(3,))
        except IndexError as exc:
            assert "reclaim_inputs" in str(exc) and "index 3" in str(exc)
        else:
            raise AssertionError("an out-of-range declaration must raise")
        # ... and the declaration does not leak into the next checkpoint
        y = torch.randn(2, 8, requires_grad=True)
        tensor_parallel.checkpoint(_stage(torch.eye(8)), False, y).sum().backward()
        assert y.untyped_storage().nbytes() > 0

    def test_a_declaration_ends_with_its_context(self):
        # A call site may declare and then not checkpoint (the chunk ran plain) or raise: the
        # declaration must not reach the next checkpoint, and an inner one must not hide an
        # outer one still pending.
        from megatron.core.tensor_parallel.checkpoint_reclaim import (
            declare_reclaimable_inputs,
            take_reclaimable_inputs,
        )

        x = torch.randn(2, 8, requires_grad=True)
        with declare_reclaimable_inputs((0,)):
            pass
        assert take_reclaimable_inputs((x,), False) == ()
        with pytest.raises(RuntimeError, match="chunk failed"):
            with declare_reclaimable_inputs((0,)):
                raise RuntimeError("chunk failed")
        assert take_reclaimable_inputs((x,), False) == ()
        with declare_reclaimable_inputs((0,)):
            with declare_reclaimable_inputs(()):
                pass
            assert take_reclaimable_inputs((x,), False) == (0,)
        y = torch.randn(2, 8, requires_grad=True)
        tensor_parallel.checkpoint(_stage(torch.eye(8)), False, y).sum().backward()
        assert y.untyped_storage().nbytes() > 0


class TestReclaimInModels:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def _run(self, reclaim, state=None, **overrides):
        torch.manual_seed(0)
        cfg = tiny_moe_mtp_config(recompute_reclaim_inputs=reclaim, **RECOMPUTE, **overrides)
        model = build_gpt(cfg)
        if state is not None:
            model.load_state_dict(state)
        seen = _first_inputs(model, enumerate(model.decoder.layers))
        mtp_seen = {}
        model.mtp.register_forward_pre_hook(
            lambda m, a, kw: mtp_seen.update(kw), with_kwargs=True
        )

        def mtp_layer_hook(mod, args, kwargs):
            mtp_seen.setdefault("layer_input", kwargs["hidden_states"])

        model.mtp.layers[0].register_forward_pre_hook(mtp_layer_hook, with_kwargs=True)
        tokens, position_ids, mask = causal_batch()
        model(tokens, position_ids, mask, labels=tokens).mean().backward()
        return model, seen, mtp_seen

    def test_off_by_default_keeps_every_chunk_input(self):
        # Reclaim changes when storage is freed, so it is opt-in: a config that does not ask for
        # it must behave like upstream and keep every checkpoint input until the next step.
        assert tiny_moe_mtp_config(**RECOMPUTE).recompute_reclaim_inputs is False
        torch.manual_seed(0)
        model = build_gpt(tiny_moe_mtp_config(**RECOMPUTE))
        seen = _first_inputs(model, enumerate(model.decoder.layers))
        tokens, position_ids, mask = causal_batch()
        model(tokens, position_ids, mask, labels=tokens).mean().backward()
        assert [seen[i].untyped_storage().nbytes() > 0 for i in sorted(seen)] == [True, True]

    def test_gpt_moe_mtp_full_recompute_flag_on_equals_off(self):
        off, _, _ = self._run(False)
        on, seen, _ = self._run(True, state=off.state_dict())
        assert seen[0].untyped_storage().nbytes() > 0, "chunk 0's input is not owned"
        assert seen[1].untyped_storage().nbytes() == 0, "chunk 1's input must be reclaimed"
        g_off, g_on = _grads(off), _grads(on)
        assert g_off.keys() == g_on.keys()
        for name in g_off:
            torch.testing.assert_close(g_on[name], g_off[name], rtol=0, atol=0, msg=name)

    @pytest.mark.slow
    @needs_fork_mhc
    def test_mhc_mtp_full_recompute_flag_on(self):
        mhc = dict(enable_mhc_connections=True, mhc_num_residual_streams=2)
        off, _, _ = self._run(False, **mhc)
        on, seen, mtp_seen = self._run(True, state=off.state_dict(), **mhc)
        multistream = mtp_seen["mhc_multistream"]
        # the hazard is real: the MTP layer's input shares the multistream's storage
        assert (
            mtp_seen["layer_input"].untyped_storage().data_ptr()
            == multistream.untyped_storage().data_ptr()
        )
        assert multistream.untyped_storage().nbytes() > 0, "the multistream must not be freed"
        assert seen[1].untyped_storage().nbytes() == 0, "chunk 1's input must be reclaimed"
        g_off, g_on = _grads(off), _grads(on)
        assert g_off.keys() == g_on.keys()
        for name in g_off:
            torch.testing.assert_close(g_on[name], g_off[name], rtol=0, atol=0, msg=name)


_NAIVE_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from tests.unit_tests import cpu_compat
    cpu_compat.install()
    from megatron.core.tensor_parallel import random as tp_random
    from tests.unit_tests.test_utilities import Utils, unit_device
    from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import (
        build_gpt, causal_batch, tiny_moe_mtp_config)

    def run(cfg_kwargs, state=None):
        torch.manual_seed(0)
        model = build_gpt(tiny_moe_mtp_config(**cfg_kwargs))
        if state is not None:
            model.load_state_dict(state)
        tokens, position_ids, mask = causal_batch()
        model(tokens, position_ids, mask, labels=tokens).mean().backward()
        return model

    Utils.initialize_model_parallel(1, 1)
    original = (tp_random.take_reclaimable_inputs, tp_random.release_checkpoint_inputs)

    def free_everything(args, distribute_saved_activations):  # the naive rule
        return tuple(i for i, a in enumerate(args)
                     if isinstance(a, torch.Tensor) and a.requires_grad)

    def naive_vs_reference(cfg):
        tp_random.take_reclaimable_inputs, tp_random.release_checkpoint_inputs = original
        ref = run(cfg)
        tp_random.take_reclaimable_inputs = free_everything
        tp_random.release_checkpoint_inputs = lambda owned, inputs, detached: [
            inputs[i].untyped_storage().resize_(0) for i in owned]
        naive = run(cfg, ref.state_dict())
        worst = 0.0
        for (name, p), q in zip(ref.named_parameters(), naive.parameters()):
            if q.grad is None or not torch.isfinite(q.grad).all():
                return float("inf")
            worst = max(worst, (p.grad - q.grad).abs().max().item())
        return worst

    cfg = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1,
               hidden_dropout=0.0, attention_dropout=0.0)
    # Without mHC nothing reads a checkpoint input after its backward: the naive rule is exact.
    assert naive_vs_reference(cfg) == 0.0
    print("WITHOUT_MHC_EXACT", flush=True)
    worst = naive_vs_reference(dict(cfg, enable_mhc_connections=True, mhc_num_residual_streams=2))
    print("MAXDIFF", worst, flush=True)
    sys.exit(3 if worst > 1e-6 else 0)
    """
)


class TestNaiveRuleIsUnsafe:
    @pytest.mark.slow
    @needs_fork_mhc
    def test_freeing_every_input_crashes_or_corrupts_mhc_mtp(self):
        env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
            env.pop(var, None)
        proc = subprocess.run(
            [sys.executable, "-c", _NAIVE_SCRIPT],
            env=env, cwd=str(REPO), capture_output=True, text=True, timeout=300,
        )
        tail = (proc.stdout + proc.stderr)[-3000:]
        # The same rule is harmless without mHC ...
        assert "WITHOUT_MHC_EXACT" in proc.stdout, tail
        # ... and with mHC + MTP a signal (segfault), an exception reading the freed multistream,
        # or corrupt gradients: anything but a clean run.
        assert proc.returncode != 0, f"the naive rule ran cleanly with mHC + MTP:\n{tail}"
        # A tree that refuses mHC with MTP or full recompute shows nothing about the rule.
        assert "does not support" not in tail, tail
        # Nor does a config the tree does not know (a failure to build, not the rule).
        assert "unexpected keyword argument" not in tail, tail


def _gpu_run(reclaim, steps, state=None, **overrides):
    torch.manual_seed(0)
    cfg = tiny_moe_mtp_config(
        recompute_reclaim_inputs=reclaim, use_cpu_initialization=False, **RECOMPUTE, **overrides
    )
    model = build_gpt(cfg).cuda()
    if state is not None:
        model.load_state_dict(state)
    tokens, position_ids, mask = (t.cuda() for t in causal_batch())
    torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        model(tokens, position_ids, mask, labels=tokens).mean().backward()
    torch.cuda.synchronize()  # surfaces an asynchronous illegal memory access here
    return model, torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()


@pytest.mark.gpu
class TestReclaimOnGPU:  # the lead runs these on the H200
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.parametrize(
        "mhc", [False, pytest.param(True, marks=needs_fork_mhc)], ids=["moe_mtp", "mhc_moe_mtp"]
    )
    def test_flag_on_equals_off_and_reports_memory(self, mhc):
        extra = dict(enable_mhc_connections=True, mhc_num_residual_streams=4) if mhc else {}
        off, off_now, off_peak = _gpu_run(False, 3, **extra)
        on, on_now, on_peak = _gpu_run(True, 3, state=off.state_dict(), **extra)
        print(f"reclaim off: allocated {off_now} peak {off_peak}; on: {on_now} peak {on_peak}")
        g_off, g_on = _grads(off), _grads(on)
        assert g_off.keys() == g_on.keys()
        for name in g_off:
            torch.testing.assert_close(g_on[name], g_off[name], rtol=1e-4, atol=1e-5, msg=name)
