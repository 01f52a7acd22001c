"""Manifold-constrained hyper-connections (mHC) and the MTP multistream contract.

The decoder widens the residual stream to n streams ``[s, b, n*h]``; with MTP it returns
``(contracted_hidden, mhc_multistream)`` and GPTModel must hand the multistream to the MTP block.
The verl crash this guards against: a postprocess that dropped ``mhc_multistream`` so MTP took the
``[s, b, h]`` path and died in a reshape. Here that is a clear error naming the caller.
"""

import glob
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_mtp_block_spec,
)
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.hyper_connection import (
    HyperConnection,
    HyperConnectionHead,
    expand_streams,
    sinkhorn_knopp,
)
from megatron.core.transformer.transformer_block import TransformerBlock
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import (
    BATCH,
    SEQ,
    VOCAB,
    build_gpt,
    causal_batch,
    tiny_moe_mtp_config,
)
from tests.unit_tests.test_utilities import Utils, run_distributed

N = 2
REPO = Path(__file__).resolve().parents[3]


def mhc_config(**overrides):
    values = dict(
        enable_hyper_connections=True,
        num_residual_streams=N,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    values.update(overrides)
    return tiny_moe_mtp_config(**values)


def grads_of(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


class TestSinkhornKnopp:
    def test_doubly_stochastic(self):
        torch.manual_seed(0)
        logits = torch.randn(5, 3, 4, 4)
        m = sinkhorn_knopp(logits, iterations=20)
        assert m.dtype == torch.float32
        assert (m > 0).all()
        torch.testing.assert_close(m.sum(-1), torch.ones(5, 3, 4), atol=1e-5, rtol=0)
        torch.testing.assert_close(m.sum(-2), torch.ones(5, 3, 4), atol=1e-4, rtol=0)

    def test_one_iteration_is_not_enough_for_skewed_logits(self):
        # The projection is what makes the columns sum to one, not the softmax.
        logits = torch.tensor([[5.0, 0.0, 0.0], [5.0, 0.0, 0.0], [5.0, 0.0, 0.0]])
        assert (sinkhorn_knopp(logits, 0).sum(-2) - 1).abs().max() > 0.5
        assert (sinkhorn_knopp(logits, 30).sum(-2) - 1).abs().max() < 1e-3

    def test_gradcheck_float64(self):
        torch.manual_seed(0)
        logits = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda x: sinkhorn_knopp(x, 5), (logits,))

    def test_rejects_non_square(self):
        with pytest.raises(ValueError, match="sinkhorn_knopp.*n, n"):
            sinkhorn_knopp(torch.zeros(2, 3, 4), 3)


class TestHyperConnectionPieces:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_use_fused_mhc_is_a_clear_error(self):
        with pytest.raises(ValueError, match="use_fused_mhc.*not part of this fork"):
            mhc_config(use_fused_mhc=True)

    def test_pre_post_weights_in_range_and_res_doubly_stochastic(self):
        cfg = mhc_config(num_residual_streams=4, mhc_init_gating_factor=1.0)
        hc = HyperConnection(cfg)
        torch.manual_seed(1)
        x = torch.randn(SEQ, BATCH, 4 * cfg.hidden_size) * 5
        h_pre, h_post, h_res = hc.mappings(x)
        assert h_pre.shape == (SEQ, BATCH, 4) and h_post.shape == (SEQ, BATCH, 4)
        assert h_res.shape == (SEQ, BATCH, 4, 4)
        assert h_pre.dtype == h_post.dtype == h_res.dtype == torch.float32
        assert (h_pre > 0).all() and (h_pre <= 1 + 1e-5).all()
        assert (h_post > 0).all() and (h_post < 2).all()
        # token-dependent: not every token gets the same weights
        assert h_pre.std(dim=0).max() > 1e-3
        torch.testing.assert_close(h_res.sum(-1), torch.ones(SEQ, BATCH, 4), atol=1e-5, rtol=0)
        torch.testing.assert_close(h_res.sum(-2), torch.ones(SEQ, BATCH, 4), atol=1e-2, rtol=0)

    def test_shape_flow_through_the_block(self):
        cfg = mhc_config(mtp_num_layers=None)
        spec = get_gpt_layer_local_spec(num_experts=cfg.num_moe_experts, moe_grouped_gemm=False)
        block = TransformerBlock(cfg, spec)
        seen = []
        block.layers[0].register_forward_pre_hook(
            lambda mod, args, kwargs: seen.append(kwargs["hidden_states"].shape), with_kwargs=True
        )
        x = torch.randn(SEQ, BATCH, cfg.hidden_size, requires_grad=True)
        _, _, mask = causal_batch()
        out = block(hidden_states=x, attention_mask=mask)
        assert seen == [torch.Size([SEQ, BATCH, N * cfg.hidden_size])]
        assert out.shape == (SEQ, BATCH, cfg.hidden_size)
        out.sum().backward()
        assert x.grad is not None and x.grad.abs().sum() > 0

    def test_expand_and_contract(self):
        cfg = mhc_config()
        x = torch.randn(SEQ, BATCH, cfg.hidden_size)
        streams = expand_streams(x, N)
        assert streams.shape == (SEQ, BATCH, N * cfg.hidden_size)
        torch.testing.assert_close(streams[..., cfg.hidden_size :], x)
        head = HyperConnectionHead(cfg)
        out = head(streams)
        assert out.shape == (SEQ, BATCH, cfg.hidden_size)
        # identical streams: the contraction is x scaled by the summed gates
        gates = head.weights(streams).sum(-1, keepdim=True)
        torch.testing.assert_close(out, x * gates)
        with pytest.raises(ValueError, match="HyperConnectionHead"):
            head(x)


class TestGPTWithHyperConnections:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_trains_with_falling_loss(self):
        torch.manual_seed(0)
        model = build_gpt(mhc_config())
        tokens, position_ids, mask = causal_batch()
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(6):
            opt.zero_grad()
            loss = model(tokens, position_ids, mask, labels=tokens).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert all(torch.isfinite(torch.tensor(losses)))
        assert losses[-1] < losses[0] - 0.1, losses
        hc = [n for n, p in model.named_parameters() if "hyper_connection" in n or "hc_head" in n]
        assert any(n.startswith("mtp.") for n in hc) and any(n.startswith("decoder.") for n in hc)

    def test_mtp_block_receives_the_multistream(self):
        model = build_gpt(mhc_config())
        seen = {}

        def block_hook(mod, args, kwargs):
            seen["block"] = kwargs["mhc_multistream"].shape
            seen["block_hidden"] = kwargs["hidden_states"].shape

        def layer_hook(mod, args, kwargs):
            seen["layer"] = kwargs["hidden_states"].shape

        model.mtp.register_forward_pre_hook(block_hook, with_kwargs=True)
        model.mtp.layers[0].register_forward_pre_hook(layer_hook, with_kwargs=True)
        tokens, position_ids, mask = causal_batch()
        loss = model(tokens, position_ids, mask, labels=tokens)
        h = model.config.hidden_size
        assert seen["block"] == (SEQ, BATCH, N * h)
        assert seen["block_hidden"] == (SEQ, BATCH, h)  # contracted output, for the main loss
        assert seen["layer"] == (SEQ, BATCH, N * h)
        loss.mean().backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None]
        assert not missing, missing

    def test_sharded_state_dict_carries_the_mhc_parameters(self):
        model = build_gpt(mhc_config())
        mhc = {n for n, _ in model.named_parameters() if "hyper_connection" in n or "hc_head" in n}
        assert "decoder.hc_head.hc_head_fn" in mhc and "mtp.layers.0.hc_head.hc_head_fn" in mhc
        sharded = model.sharded_state_dict()
        assert mhc <= set(sharded), sorted(mhc - set(sharded))

    def test_dropped_multistream_is_a_clear_error(self):
        model = build_gpt(mhc_config())
        original = model._postprocess

        def postprocess_that_drops_it(**kwargs):  # what the buggy verl override did
            kwargs["mhc_multistream"] = None
            return original(**kwargs)

        model._postprocess = postprocess_that_drops_it
        tokens, position_ids, mask = causal_batch()
        with pytest.raises(ValueError, match=r"MultiTokenPredictionBlock\.forward.*got None"):
            model(tokens, position_ids, mask, labels=tokens)

    def test_detached_mtp_heads_take_the_multistream_without_grad_to_the_decoder(self):
        torch.manual_seed(0)
        model = build_gpt(mhc_config(mtp_detach_heads=True))
        seen = {}

        def layer_hook(mod, args, kwargs):
            seen["input"] = kwargs["hidden_states"]

        model.mtp.layers[0].register_forward_pre_hook(layer_hook, with_kwargs=True)
        tokens, position_ids, mask = causal_batch()
        loss = model(tokens, position_ids, mask, labels=tokens)
        assert seen["input"].shape == (SEQ, BATCH, N * model.config.hidden_size)
        assert seen["input"].grad_fn is None, "the MTP depth input must be cut from the decoder"
        loss.mean().backward()
        for prefix in ("decoder.", "mtp."):
            grads = [p.grad for n, p in model.named_parameters() if n.startswith(prefix)]
            assert grads and all(g is not None and g.abs().sum() > 0 for g in grads), prefix

    def test_full_recompute_grads_equal_no_recompute(self):
        torch.manual_seed(0)
        plain = build_gpt(mhc_config())
        recompute = build_gpt(
            mhc_config(
                recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
            )
        )
        recompute.load_state_dict(plain.state_dict())
        tokens, position_ids, mask = causal_batch()
        for model in (plain, recompute):
            model(tokens, position_ids, mask, labels=tokens).mean().backward()
        g0, g1 = grads_of(plain), grads_of(recompute)
        assert g0.keys() == g1.keys() and len(g0) == len(list(plain.parameters()))
        for name in g0:
            torch.testing.assert_close(g1[name], g0[name], rtol=1e-5, atol=1e-6, msg=name)


_FLAG_OFF_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from tests.unit_tests import cpu_compat
    cpu_compat.install()
    import megatron.core
    assert megatron.core.__file__.startswith(sys.argv[1]), megatron.core.__file__
    from tests.unit_tests.test_utilities import Utils
    from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import (
        build_gpt, causal_batch, tiny_moe_mtp_config)
    Utils.initialize_model_parallel(1, 1)
    torch.manual_seed(7)
    model = build_gpt(tiny_moe_mtp_config(hidden_dropout=0.0, attention_dropout=0.0))
    tokens, position_ids, mask = causal_batch()
    loss = model(tokens, position_ids, mask, labels=tokens)
    loss.mean().backward()
    model.eval()
    with torch.no_grad():
        logits = model(tokens, position_ids, mask)
    torch.save(dict(state={k: v for k, v in model.state_dict().items() if torch.is_tensor(v)},
                    loss=loss.detach(), logits=logits,
                    grads={n: p.grad for n, p in model.named_parameters()}), sys.argv[2])
    Utils.destroy_model_parallel()
    Utils.destroy_process_group()
    """
)


def _run_flag_off(root, out):
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{REPO}")
    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env.pop(var, None)  # the child starts its own single-rank group
    proc = subprocess.run(
        [sys.executable, "-c", _FLAG_OFF_SCRIPT, str(root), str(out)],
        env=env, cwd=str(out.parent), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out)


class TestFlagOffEqualsUnpatched:
    def test_state_dict_and_outputs_equal_the_unpatched_model(self, tmp_path):
        import megatron.core

        patched_root = Path(megatron.core.__file__).resolve().parents[2]
        patches = glob.glob(str(REPO / "patches" / "*-mhc-hyper-connections.patch"))
        assert len(patches) == 1, patches
        unpatched_root = tmp_path / "unpatched"
        shutil.copytree(
            patched_root / "megatron",
            unpatched_root / "megatron",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        reverse = subprocess.run(
            ["git", "apply", "-R", "-C0", "-p1", patches[0]],
            cwd=unpatched_root, capture_output=True, text=True,
        )
        assert reverse.returncode == 0, f"could not reverse the mHC patch: {reverse.stderr}"
        assert not (unpatched_root / "megatron/core/transformer/hyper_connection.py").exists()

        ours = _run_flag_off(patched_root, tmp_path / "patched.pt")
        theirs = _run_flag_off(unpatched_root, tmp_path / "unpatched.pt")
        assert ours["state"].keys() == theirs["state"].keys()
        for key in ours["state"]:
            assert torch.equal(ours["state"][key], theirs["state"][key]), key
        assert torch.equal(ours["loss"], theirs["loss"])
        assert torch.equal(ours["logits"], theirs["logits"])
        assert ours["grads"].keys() == theirs["grads"].keys()
        for key in ours["grads"]:
            assert torch.equal(ours["grads"][key], theirs["grads"][key]), key


def _pipeline_parallel_two_stages(rank, world_size):
    import torch.distributed as dist

    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel.schedules import get_tensor_shapes

    if not torch.cuda.is_available():
        # LanguageModule moves the MTP stage's embedding copy with .cuda() before syncing it.
        torch.Tensor.cuda = lambda self, *args, **kwargs: self
    Utils.initialize_model_parallel(1, 2)
    cfg = mhc_config(pipeline_model_parallel_size=2, pipeline_dtype=torch.float32)
    spec = get_gpt_layer_local_spec(num_experts=cfg.num_moe_experts, moe_grouped_gemm=False)
    model = GPTModel(
        cfg,
        spec,
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        mtp_block_spec=get_gpt_mtp_block_spec(cfg, spec, use_transformer_engine=False),
        share_embeddings_and_output_weights=False,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
    )
    (shape,) = get_tensor_shapes(
        seq_length=SEQ,
        micro_batch_size=BATCH,
        decoder_seq_length=None,
        config=cfg,
        tp_group=ps.get_tensor_model_parallel_group(),
        cp_group=ps.get_context_parallel_group(),
    )
    assert shape == (SEQ, BATCH, N * cfg.hidden_size), shape
    tokens, position_ids, mask = causal_batch()
    if rank == 0:
        assert model.pre_process and not model.mtp_process
        out = model(tokens, position_ids, mask)
        assert out.shape == shape, out.shape
        dist.send(out.detach().contiguous(), 1)
        grad = torch.empty(shape)
        dist.recv(grad, 1)
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0
        out.backward(grad)
    else:
        assert model.post_process and model.mtp_process
        received = torch.empty(shape)
        dist.recv(received, 0)
        received.requires_grad_(True)
        model.set_input_tensor(received)
        loss = model(tokens, position_ids, mask, labels=tokens)
        assert loss.shape == (BATCH, SEQ) and torch.isfinite(loss).all()
        loss.mean().backward()
        dist.send(received.grad.contiguous(), 0)
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"rank {rank}: no grad for {missing}"


class TestPipelineParallel:
    def test_two_gloo_ranks_forward_backward(self):
        run_distributed(_pipeline_parallel_two_stages, 2)


@pytest.mark.gpu
class TestHyperConnectionsBF16OnGPU:  # the lead runs these on the H200
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_bf16_forward_backward(self):
        cfg = mhc_config(
            bf16=True, params_dtype=torch.bfloat16, use_cpu_initialization=False,
            num_residual_streams=4,
        )
        # Plain GPTModel (no Float16Module): cast every parameter, position embeddings included.
        model = build_gpt(cfg).cuda().bfloat16()
        seen = {}
        model.mtp.register_forward_pre_hook(
            lambda m, a, kw: seen.update(ms=kw["mhc_multistream"]), with_kwargs=True
        )
        tokens, position_ids, mask = (t.cuda() for t in causal_batch())
        loss = model(tokens, position_ids, mask, labels=tokens)
        assert seen["ms"].dtype == torch.bfloat16
        assert seen["ms"].shape == (SEQ, BATCH, 4 * cfg.hidden_size)
        assert torch.isfinite(loss).all()
        loss.float().mean().backward()
        torch.cuda.synchronize()
        for n, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), n
