"""Manifold-constrained hyper-connections (mHC): the basic layer, full recompute, pipeline stages.

The decoder widens the residual stream to n streams ``[s, b, n*h]``. The math is checked against
the formulas in float64; every layer option the mHC forward would bypass is supported or refused.
The MTP multistream contract has its own file (``test_mhc_multistream.py``).
"""


import math

import pytest
import torch

from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_mtp_block_spec,
)
from megatron.core.transformer import hyper_connection
from megatron.core.transformer.hyper_connection import (
    HyperConnection,
    HyperConnectionHead,
    expand_streams,
    sinkhorn_log,
    validate_hyper_connection_config,
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
from tests.unit_tests.transformer.mtp_testing import train_on_batch

N = 2


def mhc_config(**overrides):
    """The tiny MoE GPT config with mHC (upstream main's names) and without MTP."""
    values = dict(
        enable_mhc_connections=True,
        mhc_num_residual_streams=N,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        mtp_num_layers=None,
    )
    values.update(overrides)
    return tiny_moe_mtp_config(**values)


# Upstream main has its own mHC (HyperConnectionModule): the fork's layer is one of two there, so
# its checks run when a plain TransformerLayer builds it, not in the config, and the mHC options
# upstream's layer supports (mhc_recompute_layer_num) are no config error.
UPSTREAM_HAS_MHC = hasattr(hyper_connection, "HyperConnectionModule")


def build_mhc_block(**overrides):
    """Config and a block of the fork's mHC layer (plain local spec): where the fork's checks
    run on either base."""
    cfg = mhc_config(**overrides)
    spec = get_gpt_layer_local_spec(num_experts=cfg.num_moe_experts, moe_grouped_gemm=False)
    return TransformerBlock(cfg, spec)


def mhc_mtp_config(**overrides):
    """``mhc_config`` with one MTP layer."""
    return mhc_config(**{"mtp_num_layers": 1, **overrides})


def grads_of(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def mhc_grads_after_tp_all_reduce(sequence_parallel):
    """Grads of a HyperConnection and a HyperConnectionHead (all ones) after finalize_model_grads'
    tensor-parallel all-reduce of replicated weights, over two TP ranks with equal grads.

    Under sequence parallelism each TP rank's grad of a replicated weight covers other tokens, so
    they must be summed like the layernorm grads (the ``sequence_parallel`` parameter attribute).
    """
    from unittest import mock

    from megatron.core.distributed.finalize_model_grads import (
        _allreduce_non_tensor_model_parallel_grads,
    )

    cfg = mhc_config(tensor_model_parallel_size=2, sequence_parallel=sequence_parallel)
    chunk = torch.nn.ModuleDict(
        {"hyper_connection": HyperConnection(cfg), "hc_head": HyperConnectionHead(cfg)}
    )
    chunk.ddp_config = type("DDPConfig", (), {"use_megatron_fsdp": False})()
    for p in chunk.parameters():
        p.grad = torch.ones_like(p)

    class TwoRankGroup:
        def size(self):
            return 2

    def all_reduce_over_two_equal_ranks(tensor, op=None, group=None):
        tensor.mul_(2)

    with mock.patch.object(torch.distributed, "all_reduce", all_reduce_over_two_equal_ranks):
        _allreduce_non_tensor_model_parallel_grads([chunk], cfg, tp_group=TwoRankGroup())
    return {name: p.grad for name, p in chunk.named_parameters()}


class TestSinkhornLog:
    def test_rows_exact_columns_converge(self):
        torch.manual_seed(0)
        logits = torch.randn(5, 3, 4, 4)
        m = sinkhorn_log(logits, iters=20)
        assert m.dtype == torch.float32
        assert (m > 0).all()
        torch.testing.assert_close(m.sum(-1), torch.ones(5, 3, 4), atol=1e-6, rtol=0)
        torch.testing.assert_close(m.sum(-2), torch.ones(5, 3, 4), atol=1e-4, rtol=0)

    def test_one_iteration_is_not_enough_for_skewed_logits(self):
        # The iteration is what makes the columns sum to one, not the first row normalisation.
        logits = torch.tensor([[5.0, 0.0, 0.0], [5.0, 0.0, 0.0], [5.0, 0.0, 0.0]])
        assert (sinkhorn_log(logits, 0).sum(-2) - 1).abs().max() > 0.5
        assert (sinkhorn_log(logits, 30).sum(-2) - 1).abs().max() < 1e-3

    @pytest.mark.slow
    @pytest.mark.parametrize("std", [10.0, 50.0, 100.0, 1e3])
    def test_finite_gradients_for_wide_logits(self, std):
        # Probability-space Sinkhorn gave NaN gradients on 2.8% of tokens at std 50, 27% at 100.
        gen = torch.Generator().manual_seed(int(std))
        logits = (torch.randn(20000, 4, 4, generator=gen) * std).requires_grad_(True)
        m = sinkhorn_log(logits, 20)
        assert torch.isfinite(m).all()
        torch.testing.assert_close(m.sum(-1), torch.ones(20000, 4), atol=1e-5, rtol=0)
        m.backward(torch.randn(m.shape, generator=gen))
        assert torch.isfinite(logits.grad).all()

    def test_infinite_logits_give_finite_matrices_and_gradients(self):
        """Mapping logits that overflowed (+-inf, a whole row of +inf) are clamped first: the
        log-potentials stay finite, rows sum to 1, the gradient is finite."""
        gen = torch.Generator().manual_seed(3)
        logits = torch.randn(8, 4, 4, generator=gen)
        logits[0, 1, 2], logits[1, 3, 0], logits[2, 0, :] = math.inf, -math.inf, math.inf
        logits.requires_grad_(True)
        m = sinkhorn_log(logits, 20)
        assert torch.isfinite(m).all()
        torch.testing.assert_close(m.sum(-1), torch.ones(8, 4), atol=1e-5, rtol=0)
        m.backward(torch.randn(m.shape, generator=gen))
        assert torch.isfinite(logits.grad).all()

    @pytest.mark.parametrize("gap", [1e2, 1e4, 1e8, 1e30, 3e38])
    def test_finite_gradients_with_a_column_far_below_the_rest(self, gap):
        gen = torch.Generator().manual_seed(1)
        base = torch.randn(64, 4, 4, generator=gen)
        base[:, :, 1] -= gap  # one column far below: in probability space it underflows to 0/0
        base[::2, 2, :] += gap / 2  # and a row far above in half the tokens
        logits = base.requires_grad_(True)
        m = sinkhorn_log(logits, 20)
        assert torch.isfinite(m).all() and (m >= 0).all()
        torch.testing.assert_close(m.sum(-1), torch.ones(64, 4), atol=1e-5, rtol=0)
        m.backward(torch.randn(m.shape, generator=gen))
        assert torch.isfinite(logits.grad).all()

    def test_invariant_to_row_and_column_shifts(self):
        # Sinkhorn's fixed point depends on the logits only up to row and column constants.
        torch.manual_seed(2)
        logits = torch.randn(8, 3, 3, dtype=torch.float64)
        shifted = logits + torch.randn(8, 3, 1, dtype=torch.float64) * 50
        shifted = shifted + torch.randn(8, 1, 3, dtype=torch.float64) * 50
        torch.testing.assert_close(sinkhorn_log(shifted, 200), sinkhorn_log(logits, 200))

    def test_gradcheck_float64(self):
        torch.manual_seed(0)
        logits = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda x: sinkhorn_log(x, 5), (logits,))

    def test_rejects_non_square(self):
        with pytest.raises(ValueError, match="sinkhorn_log.*n, n"):
            sinkhorn_log(torch.zeros(2, 3, 4), 3)


class TestHyperConnectionPieces:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_mhc_recompute_layer_num_is_a_clear_error(self):
        # the block size of the selective "mhc" recompute: refused while that recompute is off
        with pytest.raises(ValueError, match="mhc_recompute_layer_num=2: .*selective 'mhc'"):
            build_mhc_block(mhc_recompute_layer_num=2)
        if not UPSTREAM_HAS_MHC:  # on main it is upstream's own field, valid with mHC off
            with pytest.raises(ValueError, match="mhc_recompute_layer_num=1"):
                tiny_moe_mtp_config(mhc_recompute_layer_num=1)  # even with mHC off

    def test_pre_post_weights_in_range_and_res_doubly_stochastic(self):
        cfg = mhc_config(mhc_num_residual_streams=4, mhc_init_gating_factor=1.0)
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
        torch.testing.assert_close(h_res.sum(-1), torch.ones(SEQ, BATCH, 4), atol=1e-6, rtol=0)
        torch.testing.assert_close(h_res.sum(-2), torch.ones(SEQ, BATCH, 4), atol=1e-2, rtol=0)

    def test_residual_mix_is_a_convex_combination_per_output_stream(self):
        # With the sublayer output zero every new stream must lie inside the hull of the old ones,
        # even where Sinkhorn has not converged (wide logits): the residual gain never exceeds 1.
        cfg = mhc_config(mhc_num_residual_streams=4, mhc_init_gating_factor=1.0)
        hc = HyperConnection(cfg)
        with torch.no_grad():
            hc.mapping_weight.mul_(500.0)  # residual logits with std ~10
        torch.manual_seed(3)
        x = torch.randn(SEQ, BATCH, 4 * cfg.hidden_size)
        _, h_post, h_res = hc(x)
        zero = torch.zeros(SEQ, BATCH, cfg.hidden_size)
        new = hc.combine(x, h_post, h_res, (zero, None), 0.0, False)
        old = x.unflatten(-1, (4, cfg.hidden_size))
        new = new.unflatten(-1, (4, cfg.hidden_size))
        lo, hi = old.min(dim=2, keepdim=True).values, old.max(dim=2, keepdim=True).values
        assert (new >= lo - 1e-5).all() and (new <= hi + 1e-5).all()
        assert (h_res.sum(-2) - 1).abs().max() > 0.05, "columns should be off: test too easy"
        # stream i takes row i: a permutation-like H_res must move stream j into stream i
        perm = torch.tensor([2, 0, 3, 1])
        h_perm = torch.eye(4)[perm].expand(SEQ, BATCH, 4, 4)
        moved = hc.combine(x, torch.zeros_like(h_post), h_perm, (zero, None), 0.0, False)
        torch.testing.assert_close(moved.unflatten(-1, (4, cfg.hidden_size)), old[:, :, perm])

    def test_huge_mapping_weights_give_finite_gradients(self):
        cfg = mhc_config(mhc_num_residual_streams=4, mhc_init_gating_factor=1.0)
        hc = HyperConnection(cfg)
        with torch.no_grad():
            hc.mapping_weight.normal_(0.0, 30.0)  # residual logits with std ~ 1e3 per token
        torch.manual_seed(4)
        x = torch.randn(SEQ, BATCH, 4 * cfg.hidden_size, requires_grad=True)
        sub_in, h_post, h_res = hc(x)
        out = hc.combine(x, h_post, h_res, (torch.tanh(sub_in), None), 0.0, False)
        out.square().sum().backward()
        for name, p in hc.named_parameters():
            assert torch.isfinite(p.grad).all(), name
        assert torch.isfinite(x.grad).all()

    @pytest.mark.slow
    def test_shape_flow_through_the_block(self):
        cfg = mhc_config()
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


def _ref_sigmoid(t):
    return 1.0 / (1.0 + torch.exp(-t))


def _ref_sublayer_mhc(x, hc_params, n, iters, sublayer, norm_eps):
    """The paper's update for one sublayer, from the formulas, in float64, written without the
    module's code: Sinkhorn as alternating scaling vectors ``P = diag(u) K diag(v)``, mixing and
    weighting as explicit loops over streams. Returns the new streams ``[s, b, n*h]``."""
    weight, bias, a_pre, a_post, a_res = hc_params
    h = x.shape[-1] // n
    r = x / torch.sqrt((x * x).mean(-1, keepdim=True) + norm_eps)
    z = r @ weight.t()
    pre = _ref_sigmoid(a_pre * z[..., :n] + bias[:n]) + 1e-6
    post = 2.0 * _ref_sigmoid(a_post * z[..., n : 2 * n] + bias[n : 2 * n])
    kernel = torch.exp(a_res * z[..., 2 * n :] + bias[2 * n :]).reshape(*x.shape[:-1], n, n)
    u = 1.0 / kernel.sum(-1)  # rows first (v = 1)
    v = torch.ones_like(u)
    for _ in range(iters):
        v = 1.0 / (kernel * u.unsqueeze(-1)).sum(-2)  # columns
        u = 1.0 / (kernel * v.unsqueeze(-2)).sum(-1)  # rows, last
    res = u.unsqueeze(-1) * kernel * v.unsqueeze(-2)
    streams = [x[..., j * h : (j + 1) * h] for j in range(n)]
    sub_in = sum(pre[..., j : j + 1] * streams[j] for j in range(n))
    y = sublayer(sub_in)
    new = []
    for i in range(n):
        mixed = sum(res[..., i, j : j + 1] * streams[j] for j in range(n))
        new.append(mixed + post[..., i : i + 1] * y)
    return torch.cat(new, dim=-1)


def _ref_head(x, head_fn, head_base, head_scale, n, norm_eps):
    h = x.shape[-1] // n
    r = x / torch.sqrt((x * x).mean(-1, keepdim=True) + norm_eps)
    w = _ref_sigmoid(head_scale * (r @ head_fn.t()) + head_base) + 1e-6
    return sum(w[..., j : j + 1] * x[..., j * h : (j + 1) * h] for j in range(n))


def _hc_params(hc):
    return (hc.mapping_weight, hc.mapping_bias, hc.alpha_pre, hc.alpha_post, hc.alpha_res)


class TestFloat64Reference:
    """The whole mHC forward and backward against the formulas, in float64."""

    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def _randomize(self, module, gen, scale=0.3):
        with torch.no_grad():
            for p in module.parameters():
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale)

    def test_sublayer_and_head_match_the_formulas(self):
        n, iters = 3, 7
        cfg = mhc_config(mhc_num_residual_streams=n, mhc_sinkhorn_iterations=iters,
                         mhc_init_gating_factor=0.5)
        h = cfg.hidden_size
        gen = torch.Generator().manual_seed(5)
        hc, head = HyperConnection(cfg).double(), HyperConnectionHead(cfg).double()
        self._randomize(hc, gen)
        self._randomize(head, gen)
        with torch.no_grad():
            hc.mapping_weight.mul_(20.0)  # token-dependent mappings far from their init
        sub = torch.nn.Linear(h, h).double()
        x = torch.randn(SEQ, BATCH, n * h, generator=gen, dtype=torch.float64)
        probe = torch.randn(SEQ, BATCH, h, generator=gen, dtype=torch.float64)
        leaves = [x, *hc.parameters(), *head.parameters(), *sub.parameters()]

        def sublayer(u):
            return torch.tanh(sub(u))

        def run(forward):
            for t in leaves:
                t.grad = None
                t.requires_grad_(True)
            out = forward()
            (out * probe).sum().backward()
            return out.detach(), [t.grad.clone() for t in leaves]

        def module_path():
            sub_in, h_post, h_res = hc(x)
            streams = hc.combine(x, h_post, h_res, (sublayer(sub_in), None), 0.0, False)
            return head(streams)

        def reference_path():
            eps = cfg.layernorm_epsilon
            streams = _ref_sublayer_mhc(x, _hc_params(hc), n, iters, sublayer, eps)
            return _ref_head(streams, head.hc_head_fn, head.hc_head_base, head.hc_head_scale,
                             n, eps)

        out, grads = run(module_path)
        ref_out, ref_grads = run(reference_path)
        assert out.dtype == torch.float64
        torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
        names = ["x"] + [f"hc.{k}" for k, _ in hc.named_parameters()]
        names += [f"head.{k}" for k, _ in head.named_parameters()]
        names += [f"sub.{k}" for k, _ in sub.named_parameters()]
        for name, g, ref in zip(names, grads, ref_grads):
            assert ref.abs().max() > 0, name
            torch.testing.assert_close(g, ref, rtol=1e-9, atol=1e-11, msg=name)

    @pytest.mark.parametrize("post_norms", [False, True], ids=["plain", "post_norms"])
    def test_transformer_layer_matches_the_formulas(self, post_norms):
        # The layer wiring: attention then MLP, each through its norm (and, with the GLM-style
        # post-sublayer norms, a norm of its output), mixed by its own mHC.
        n, iters = 2, 5
        cfg = mhc_config(mhc_num_residual_streams=n, mhc_sinkhorn_iterations=iters,
                         num_moe_experts=None, mhc_init_gating_factor=0.5,
                         post_self_attn_layernorm=post_norms, post_mlp_layernorm=post_norms)
        spec = get_gpt_layer_local_spec()
        block = TransformerBlock(cfg, spec, post_process=False).double()
        layer = block.layers[0]
        gen = torch.Generator().manual_seed(6)
        self._randomize(layer.self_attention_hyper_connection, gen)
        self._randomize(layer.mlp_hyper_connection, gen)
        if post_norms:  # away from the unit init, so a skipped norm cannot go unnoticed
            self._randomize(layer.post_self_attn_layernorm, gen)
            self._randomize(layer.post_mlp_layernorm, gen)
        _, _, mask = causal_batch()
        x = torch.randn(SEQ, BATCH, n * cfg.hidden_size, generator=gen, dtype=torch.float64)
        probe = torch.randn(x.shape, generator=gen, dtype=torch.float64)
        params = list(layer.parameters())

        def run(forward):
            for t in [x, *params]:
                t.grad = None
            x.requires_grad_(True)
            out = forward()
            (out * probe).sum().backward()
            return out.detach(), [x.grad.clone()] + [p.grad.clone() for p in params]

        def post(norm, out):
            return norm(out) if post_norms else out

        def attention(u):
            out, bias = layer.self_attention(layer.input_layernorm(u), attention_mask=mask)
            return post(layer.post_self_attn_layernorm, out if bias is None else out + bias)

        def mlp(u):
            out, bias = layer.mlp(layer.pre_mlp_layernorm(u))
            return post(layer.post_mlp_layernorm, out if bias is None else out + bias)

        def reference():
            eps = cfg.layernorm_epsilon
            hc_a = _hc_params(layer.self_attention_hyper_connection)
            hc_m = _hc_params(layer.mlp_hyper_connection)
            mid = _ref_sublayer_mhc(x, hc_a, n, iters, attention, eps)
            return _ref_sublayer_mhc(mid, hc_m, n, iters, mlp, eps)

        out, grads = run(lambda: layer(hidden_states=x, attention_mask=mask)[0])
        ref_out, ref_grads = run(reference)
        torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
        names = ["x"] + [k for k, _ in layer.named_parameters()]
        assert any("post_mlp_layernorm" in k for k in names) == post_norms
        for name, g, ref in zip(names, grads, ref_grads):
            torch.testing.assert_close(g, ref, rtol=1e-9, atol=1e-11, msg=name)


class TestLayerOptionsUnderMHC:
    """Every TransformerLayer option the mHC forward would bypass is supported or refused."""

    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.slow
    def test_post_sublayer_norms_train_in_the_mhc_layer(self):
        torch.manual_seed(0)
        model = build_gpt(
            mhc_config(post_self_attn_layernorm=True, post_mlp_layernorm=True), with_mtp=False
        )
        norms = [n for n, _ in model.named_parameters() if ".post_" in n and "layernorm" in n]
        assert len(norms) == 8, norms  # 2 layers, two norms each, weight and bias
        tokens, position_ids, mask = causal_batch()
        model(tokens, position_ids, mask, labels=tokens).mean().backward()
        params = dict(model.named_parameters())
        dead = [n for n in norms if params[n].grad is None or not params[n].grad.abs().sum() > 0]
        assert not dead, f"post-sublayer norm parameters without gradient under mHC: {dead}"

    @pytest.mark.parametrize(
        "field, value, extra",
        [
            ("fused_residual_rmsnorm", True, dict(normalization="RMSNorm")),
            ("mlp_chunks_for_training", 2, {}),
            ("mlp_chunks_for_prefill", 2, {}),
            ("fp32_residual_connection", True, {}),
        ],
    )
    def test_bypassed_config_options_are_refused(self, field, value, extra):
        # upstream main refuses fp32_residual_connection in its config, in its own words
        said = "(does not support|is not compatible with)"
        refused = (ValueError, NotImplementedError)
        with pytest.raises(refused, match=f"enable_mhc_connections {said} {field}"):
            build_mhc_block(**{field: value}, **extra)

    @pytest.mark.parametrize(
        "field, value",
        [
            ("fine_grained_activation_offloading", True),
            ("cuda_graph_impl", "local"),
            ("inference_fuse_tp_communication", True),
            ("overlap_moe_expert_parallel_comm", True),
        ],
    )
    def test_options_the_mhc_forward_bypasses_are_refused(self, field, value):
        # These options have prerequisites of their own (CUDA, TP/EP > 1) that the tiny CPU
        # config cannot meet, so the mHC check is run on a valid config with the field set.
        cfg = mhc_config()
        validate_hyper_connection_config(cfg)
        setattr(cfg, field, value)
        with pytest.raises(
            ValueError, match=f"enable_mhc_connections does not support {field}={value}"
        ):
            validate_hyper_connection_config(cfg)

    def test_selective_recompute_of_layer_norms_is_refused(self):
        with pytest.raises(ValueError, match=r"selective recompute of \['layernorm'\]"):
            build_mhc_block(recompute_granularity="selective", recompute_modules=["layernorm"])

    @pytest.mark.parametrize("field", ["self_attn_bda", "mlp_bda"])
    def test_non_standard_bias_dropout_add_is_refused(self, field):
        from megatron.core.transformer.identity_op import IdentityFuncOp

        cfg = mhc_config(num_moe_experts=None)
        spec = get_gpt_layer_local_spec()
        setattr(spec.submodules, field, IdentityFuncOp)
        with pytest.raises(ValueError, match=f"layer 1: {field} is .*get_bias_dropout_add"):
            TransformerBlock(cfg, spec)

    def test_missing_sublayer_is_refused(self):
        from megatron.core.transformer.identity_op import IdentityOp

        cfg = mhc_config(num_moe_experts=None)
        spec = get_gpt_layer_local_spec()
        spec.submodules.mlp = IdentityOp
        with pytest.raises(ValueError, match="layer 1 has no mlp"):
            TransformerBlock(cfg, spec)


class TestGPTWithHyperConnections:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.slow
    def test_trains_with_falling_loss(self):
        torch.manual_seed(0)
        model = build_gpt(mhc_config(), with_mtp=False)
        losses = train_on_batch(model, causal_batch(), steps=6)
        assert all(torch.isfinite(torch.tensor(losses)))
        assert losses[-1] < losses[0] - 0.1, losses
        missing = [n for n, p in model.named_parameters() if p.grad is None]
        assert not missing, missing
        hc = [n for n, p in model.named_parameters() if "hyper_connection" in n or "hc_head" in n]
        assert "decoder.hc_head.hc_head_fn" in hc and len(hc) == 2 * 2 * 5 + 3, hc

    def test_sharded_state_dict_carries_the_mhc_parameters(self):
        model = build_gpt(mhc_config(), with_mtp=False)
        mhc = {n for n, _ in model.named_parameters() if "hyper_connection" in n or "hc_head" in n}
        assert "decoder.hc_head.hc_head_fn" in mhc
        assert "decoder.layers.0.self_attention_hyper_connection.mapping_weight" in mhc
        sharded = model.sharded_state_dict()
        assert mhc <= set(sharded), sorted(mhc - set(sharded))
        # Replicated over TP ranks: under sequence parallelism their grads are summed over TP.
        for sequence_parallel in (False, True):
            grads = mhc_grads_after_tp_all_reduce(sequence_parallel)
            expected = 2.0 if sequence_parallel else 1.0
            assert len(grads) == 5 + 3, sorted(grads)
            for name, grad in grads.items():
                assert torch.equal(grad, torch.full_like(grad, expected)), (sequence_parallel, name)


class TestFullRecompute:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.slow
    @pytest.mark.parametrize("method", ["uniform", "block"])
    @pytest.mark.parametrize("mtp", [False, True], ids=["no_mtp", "mtp"])
    def test_grads_equal_no_recompute(self, method, mtp):
        make = mhc_mtp_config if mtp else mhc_config
        torch.manual_seed(0)
        plain = build_gpt(make(), with_mtp=mtp)
        recompute = build_gpt(
            make(recompute_granularity="full", recompute_method=method, recompute_num_layers=1),
            with_mtp=mtp,
        )
        recompute.load_state_dict(plain.state_dict())
        tokens, position_ids, mask = causal_batch()
        for model in (plain, recompute):
            model(tokens, position_ids, mask, labels=tokens).mean().backward()
        g0, g1 = grads_of(plain), grads_of(recompute)
        assert g0.keys() == g1.keys() and len(g0) == len(list(plain.parameters()))
        for name in g0:
            torch.testing.assert_close(g1[name], g0[name], rtol=1e-5, atol=1e-6, msg=name)


def _pipeline_parallel_two_stages(rank, world_size):
    import torch.distributed as dist

    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel.schedules import get_tensor_shapes

    if not torch.cuda.is_available():
        # LanguageModule moves the MTP stage's embedding copy with .cuda() before syncing it.
        torch.Tensor.cuda = lambda self, *args, **kwargs: self
    Utils.initialize_model_parallel(1, 2)
    cfg = mhc_mtp_config(pipeline_model_parallel_size=2, pipeline_dtype=torch.float32)
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


def _interleaved_training_step(schedules, forward_step, chunks, batches):
    """One interleaved 1F1B training step of four micro-batches over ``chunks`` (losses on the
    last stage)."""
    return schedules.forward_backward_pipelining_with_interleaving(
        forward_step_func=forward_step,
        data_iterator=[iter(batches) for _ in chunks],
        model=chunks,
        num_microbatches=4,
        seq_length=SEQ,
        micro_batch_size=BATCH,
        forward_only=False,
    )


def _interleaved_pipeline_two_ranks(rank, world_size):
    """The interleaved (VPP) schedule: 2 pipeline ranks x 2 model chunks, one layer each. Every
    chunk boundary sends the n streams, so the schedule's buffers must be [s, b, n*h]."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import schedules

    Utils.initialize_model_parallel(
        pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2
    )
    torch.manual_seed(3)
    cfg = mhc_config(
        num_layers=4,
        pipeline_model_parallel_size=2,
        virtual_pipeline_model_parallel_size=2,
        pipeline_dtype=torch.float32,
    )
    spec = get_gpt_layer_local_spec(num_experts=cfg.num_moe_experts, moe_grouped_gemm=False)
    chunks = [
        GPTModel(
            cfg,
            spec,
            vocab_size=VOCAB,
            max_sequence_length=SEQ,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
            vp_stage=stage,
        )
        for stage in range(2)
    ]
    sent = []
    for chunk in chunks:
        chunk.decoder.register_forward_hook(lambda m, a, out: sent.append(tuple(out.shape)))
    batches = [causal_batch(seed=m) for m in range(4)]

    def forward_step(data_iterator, chunk):
        tokens, position_ids, mask = next(data_iterator)
        out = chunk(tokens, position_ids, mask, labels=tokens)

        def loss_func(output):
            loss = output.float().mean()
            return loss, {"loss": loss.detach()}

        return out, loss_func

    losses = _interleaved_training_step(schedules, forward_step, chunks, batches)
    # Each rank holds one chunk whose decoder hands n streams to the next stage.
    assert (SEQ, BATCH, N * cfg.hidden_size) in sent, sent
    if rank == 1:
        assert len(losses) == 4 and all(torch.isfinite(l["loss"]) for l in losses)
    missing = [n for c in chunks for n, p in c.named_parameters() if p.grad is None]
    assert not missing, f"rank {rank}: no grad for {missing}"
    _interleaved_plain_model_parallel_config(rank, batches)


class _PlainChunk(torch.nn.Module):
    """A model chunk whose config is a plain ModelParallelConfig (no TransformerConfig fields,
    so no mHC switch): what the schedules accept besides Megatron's own models."""

    def __init__(self, config, pre_process):
        from megatron.core.enums import ModelType

        super().__init__()
        self.config, self.pre_process = config, pre_process
        self.model_type = ModelType.encoder_or_decoder
        self.proj = torch.nn.Linear(config.hidden_size, config.hidden_size)
        self.input_tensor = None

    def set_input_tensor(self, tensor):
        self.input_tensor = tensor[0] if isinstance(tensor, list) else tensor

    def forward(self, embedded):
        return self.proj(embedded if self.pre_process else self.input_tensor)


def _interleaved_plain_model_parallel_config(rank, batches):
    """The same schedule with ModelParallelConfig chunks: the stage buffers stay [s, b, h]."""
    from megatron.core import parallel_state as ps
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.pipeline_parallel import schedules

    hidden = 8
    config = ModelParallelConfig(
        pipeline_model_parallel_size=2,
        virtual_pipeline_model_parallel_size=2,
        pipeline_dtype=torch.float32,
    )
    assert not hasattr(config, "enable_mhc_connections")
    config.hidden_size = hidden  # the one model field the schedules read from the config
    chunks = [
        _PlainChunk(config, ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage))
        for stage in range(2)
    ]
    received = []
    for chunk in chunks:
        chunk.register_forward_pre_hook(
            lambda m, a: received.append(None if m.pre_process else tuple(m.input_tensor.shape))
        )

    def forward_step(data_iterator, chunk):
        tokens, _, _ = next(data_iterator)
        embedded = torch.ones(SEQ, BATCH, hidden) * tokens.t().unsqueeze(-1) / VOCAB

        def loss_func(output):
            loss = output.float().pow(2).mean()
            return loss, {"loss": loss.detach()}

        return chunk(embedded), loss_func

    losses = _interleaved_training_step(schedules, forward_step, chunks, batches)
    assert set(r for r in received if r is not None) == {(SEQ, BATCH, hidden)}, received
    if rank == 1:
        assert len(losses) == 4 and all(torch.isfinite(l["loss"]) for l in losses)
    assert all(p.grad is not None for c in chunks for p in c.parameters()), rank


def _pipeline_parallel_inference_two_stages(rank, world_size):
    """Inference with PP=2 through the inference wrapper: the last stage receives the first
    stage's n streams, so its receive buffer must be [s, b, n*h]."""
    import torch.distributed as dist

    from megatron.core import parallel_state as ps
    from megatron.core.inference.contexts import StaticInferenceContext
    from megatron.core.inference.model_inference_wrappers.gpt.gpt_inference_wrapper import (
        GPTInferenceWrapper,
    )

    Utils.initialize_model_parallel(1, 2)
    torch.manual_seed(5)
    cfg = mhc_config(pipeline_model_parallel_size=2, pipeline_dtype=torch.float32)
    spec = get_gpt_layer_local_spec(num_experts=cfg.num_moe_experts, moe_grouped_gemm=False)
    model = GPTModel(
        cfg,
        spec,
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
    ).eval()
    wrapper = GPTInferenceWrapper(model, StaticInferenceContext(BATCH, SEQ))
    wrapper.prep_model_for_inference()
    assert wrapper._allocate_recv_buffer(BATCH, SEQ).shape == (SEQ, BATCH, N * cfg.hidden_size)
    tokens, _, mask = causal_batch()
    inference_input = wrapper.prep_inference_input(tokens)
    inference_input["attention_mask"] = mask  # the default causal mask is made on CUDA
    logits = wrapper.run_one_forward_step(inference_input)
    if rank == 1:
        assert logits.shape[:2] == (BATCH, SEQ) and torch.isfinite(logits).all()
    dist.barrier()


class TestPipelineParallel:
    @pytest.mark.slow
    def test_inference_wrapper_two_gloo_ranks(self):
        run_distributed(_pipeline_parallel_inference_two_stages, 2)

    @pytest.mark.slow
    def test_two_gloo_ranks_forward_backward(self):
        run_distributed(_pipeline_parallel_two_stages, 2)

    @pytest.mark.slow
    def test_interleaved_schedule_two_gloo_ranks(self):
        run_distributed(_interleaved_pipeline_two_ranks, 2)


@pytest.mark.gpu
class TestHyperConnectionsBF16OnGPU:  # the lead runs these on the H200
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_bf16_forward_backward(self):
        cfg = mhc_mtp_config(
            bf16=True, params_dtype=torch.bfloat16, use_cpu_initialization=False,
            mhc_num_residual_streams=4,
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
