"""mHC weight conversion (upstream main, DeepSeek-V4 layout) and the Sinkhorn schedules.

The three schedules are re-written here in float64, independently of the fork's code, from
their descriptions (issue 25): what a converted checkpoint reproduces exactly, what only in the
Sinkhorn limit, and how far apart they are at the 20 iterations models train with.
"""

import re

import pytest
import torch

from megatron.core.transformer import hyper_connection
from megatron.core.transformer.mhc_convert import (
    deepseek_v4_sublayer_to_fork,
    fork_config_to_upstream_dev,
    fork_to_upstream_dev,
    fork_to_upstream_main,
    mean_head,
    upstream_dev_to_fork,
    upstream_main_to_fork,
)
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import build_gpt
from tests.unit_tests.test_utilities import Utils
from tests.unit_tests.transformer.mhc_convert_release_keys import (
    HIDDEN,
    NUM_STREAMS,
    RELEASE_KEYS,
    synthetic_release_state_dict,
)

n = 4
N = NUM_STREAMS  # the streams of the tiny models below (test_hyper_connection.N)

# The release line's (fork) mHC model; on the upstream-dev line dev's mHC is the model instead
# (its converter test is test_mhc_convert_dev.py).
fork_mhc_only = pytest.mark.skipif(
    not hasattr(hyper_connection, "HyperConnectionHead"),
    reason="the release line's mHC model is not on this base (upstream dev's mHC is)",
)


def mhc_config(**overrides):
    from tests.unit_tests.transformer.test_hyper_connection import mhc_config as fork_config

    return fork_config(**overrides)


def _rows(p):
    return p / p.sum(-1, keepdim=True)


def _cols(p):
    return p / p.sum(-2, keepdim=True)


def ref_fork(logits, iters):
    """Rows, then ``iters`` x (columns, rows); output stream i mixes with row i."""
    p = _rows(torch.exp(logits))
    for _ in range(iters):
        p = _rows(_cols(p))
    return p


def ref_upstream_main(logits, iters):
    """``iters`` x (rows, columns), from exp after a row-max shift; ends on columns."""
    p = torch.exp(logits - logits.amax(-1, keepdim=True))
    for _ in range(iters):
        p = _cols(_rows(p))
    return p


def ref_deepseek_v4(logits_v4, iters, eps):
    """V4's layout (row j = input stream j): softmax + eps, columns, ``iters - 1`` x (rows,
    columns). Returned in the fork's layout (row i = output stream i)."""
    p = _cols(torch.softmax(logits_v4, -1) + eps)
    for _ in range(iters - 1):
        p = _cols(_rows(p))
    return p.transpose(-1, -2)


def _logits(kind, count=2000, seed=0):
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(count, n, n, generator=gen, dtype=torch.float64)
    if kind == "init":  # the fork's init: logits 4 on the diagonal, small projections
        return 4.0 * torch.eye(n, dtype=torch.float64) + 0.5 * noise
    return 4.0 * noise  # wide: after training


class TestSinkhornSchedules:
    @fork_mhc_only
    def test_fork_schedule_is_the_documented_one(self):
        from megatron.core.transformer.hyper_connection import sinkhorn_log

        for kind in ("init", "wide"):
            logits = _logits(kind)
            got = sinkhorn_log(logits, 20)
            torch.testing.assert_close(got, ref_fork(logits, 20), rtol=0, atol=1e-12)
            torch.testing.assert_close(got.sum(-1), torch.ones(len(logits), n, dtype=torch.float64))

    @pytest.mark.slow
    @pytest.mark.parametrize("kind", ["init", "wide"])
    def test_all_schedules_share_the_limit_but_not_the_20_iteration_result(self, kind):
        logits = _logits(kind)
        fork_layout = logits
        v4_layout = logits.transpose(-1, -2)  # how V4 stores the same mixing
        limit = ref_fork(fork_layout, 3000)
        atol = 1e-8 if kind == "init" else 1e-3  # wide logits converge slowly (tiny entries)
        for other in (ref_upstream_main(fork_layout, 3000), ref_deepseek_v4(v4_layout, 3000, 0.0)):
            torch.testing.assert_close(other, limit, rtol=0, atol=atol)
        gaps = {
            "main": (ref_upstream_main(fork_layout, 20) - ref_fork(fork_layout, 20)).abs().max(),
            "v4": (ref_deepseek_v4(v4_layout, 20, 1e-6) - ref_fork(fork_layout, 20)).abs().max(),
        }
        # The same weights do not give the same H_res at 20 iterations: no converter can make
        # them; this is what "close, not equal" in mhc_convert's docstring means.
        assert all(gap > 1e-3 for gap in gaps.values()), gaps
        # Ending on rows is what keeps the fork's mixing an exact convex combination.
        main_rows = ref_upstream_main(fork_layout, 20).sum(-1)
        assert (main_rows - 1).abs().max() > 1e-6
        assert (ref_fork(fork_layout, 20).sum(-1) - 1).abs().max() < 1e-12


class TestDeepSeekV4Layout:
    def test_residual_block_is_transposed_and_gates_split(self):
        h = 3
        rows = n * n + 2 * n
        fn = torch.randn(rows, n * h, dtype=torch.float64)
        base = torch.randn(rows, dtype=torch.float64)
        scale = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
        fork = deepseek_v4_sublayer_to_fork(fn, base, scale, n)
        torch.testing.assert_close(fork["mapping_weight"][: 2 * n], fn[: 2 * n])
        v4_res = base[2 * n :].reshape(n, n)
        torch.testing.assert_close(fork["mapping_bias"][2 * n :].reshape(n, n), v4_res.T)
        x = torch.randn(n * h, dtype=torch.float64)
        # Same logits, each in its own layout: the converged mixing matrices agree.
        v4_logits = (fn[2 * n :] @ x).reshape(n, n) * scale[2] + v4_res
        fork_logits = (fork["mapping_weight"][2 * n :] @ x).reshape(n, n) * fork["alpha_res"]
        fork_logits = fork_logits + fork["mapping_bias"][2 * n :].reshape(n, n)
        torch.testing.assert_close(
            ref_fork(fork_logits, 3000), ref_deepseek_v4(v4_logits, 3000, 0.0), rtol=0, atol=1e-8
        )
        assert [fork[k].item() for k in ("alpha_pre", "alpha_post", "alpha_res")] == [0.1, 0.2, 0.3]

    def test_wrong_shapes_are_named(self):
        with pytest.raises(ValueError, match=r"expected fn \[24, n\*h\].*got \(23, 8\)"):
            deepseek_v4_sublayer_to_fork(torch.zeros(23, 8), torch.zeros(24), torch.zeros(3), n)


@fork_mhc_only
class TestUpstreamMainNames:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_main_checkpoint_loads_into_the_fork_and_contracts_by_the_mean(self):
        torch.manual_seed(0)
        model = build_gpt(mhc_config(), with_mtp=False)
        fork_sd = model.state_dict()
        # What main would have saved: its names, no head.
        main_sd = fork_to_upstream_main(fork_sd, N, drop_heads=True)
        assert not any("hc_head" in k or "mapping_weight" in k or "mapping_bias" in k for k in main_sd)
        assert "decoder.layers.0.mlp_hyper_connection.mapping_proj.weight" in main_sd
        assert "decoder.layers.0.mlp_hyper_connection.bias" in main_sd
        back = upstream_main_to_fork(main_sd, N, head_prefixes=["decoder.hc_head"])
        assert set(back) == set(fork_sd)
        model.load_state_dict(back, strict=True)
        for key in fork_sd:
            if "hc_head" not in key and isinstance(fork_sd[key], torch.Tensor):
                assert torch.equal(back[key], fork_sd[key]), key
        x = torch.randn(5, 2, N * model.config.hidden_size)
        mean = x.reshape(5, 2, N, -1).mean(2)
        torch.testing.assert_close(model.decoder.hc_head(x), mean, rtol=1e-6, atol=1e-6)

    def test_learned_head_is_not_dropped_silently(self):
        model = build_gpt(mhc_config(), with_mtp=False)
        with pytest.raises(ValueError, match="decoder.hc_head is a learned contraction head"):
            fork_to_upstream_main(model.state_dict(), N)
        sd = dict(model.state_dict())
        for name, value in mean_head(N, sd["decoder.hc_head.hc_head_fn"].shape[-1]).items():
            sd[f"decoder.hc_head.{name}"] = value
        assert not any("hc_head" in k for k in fork_to_upstream_main(sd, N))

    def test_fork_names_are_not_converted_twice(self):
        with pytest.raises(ValueError, match="already has the fork's name"):
            upstream_main_to_fork({"decoder.layers.0.mlp_hyper_connection.mapping_weight": torch.zeros(1)}, N)


def _sublayer_prefixes(keys):
    return sorted({k.rsplit(".", 1)[0] for k in keys if k.endswith("_hyper_connection.mapping_weight")})


class TestUpstreamDevMapping:
    """fork -> dev on the release line's pinned state dict: every mHC tensor, by its transform."""

    def test_every_mhc_tensor_maps_by_its_transform(self):
        fork = synthetic_release_state_dict(0, res_noise=1.0)
        dev = fork_to_upstream_dev(fork, N)
        prefixes = _sublayer_prefixes(fork)
        assert len(prefixes) == 6  # 2 decoder layers + the MTP layer, attention and MLP each
        for p in prefixes:
            for fork_name, dev_name in (("mapping_weight", "mapping_proj.weight"), ("mapping_bias", "bias")):
                src, dst = fork[f"{p}.{fork_name}"], dev[f"{p}.{dev_name}"]
                assert dst.shape == src.shape
                assert torch.equal(dst[: 2 * N], src[: 2 * N]), (p, fork_name)  # pre, post
                for i in range(N):  # fork: row 2n + i*n + j mixes input j into output i
                    for j in range(N):  # dev applies H^T: the same entry sits at (j, i)
                        assert torch.equal(dst[2 * N + j * N + i], src[2 * N + i * N + j])
            for gate in ("alpha_pre", "alpha_post", "alpha_res"):
                assert dev[f"{p}.{gate}"] is fork[f"{p}.{gate}"]
        for owner in ("decoder", "mtp.layers.0"):
            for name in ("hc_head_fn", "hc_head_base", "hc_head_scale"):
                assert dev[f"{owner}.{name}"] is fork[f"{owner}.hc_head.{name}"]
        eh = fork["mtp.layers.0.eh_proj.weight"].double()
        e_w, h_w = dev["mtp.layers.0.e_proj.weight"].double(), dev["mtp.layers.0.h_proj.weight"].double()
        emb, stream = torch.randn(7, HIDDEN, dtype=torch.float64), torch.randn(7, HIDDEN, dtype=torch.float64)
        # the fork's eh_proj([emb, x_j]) is dev's e_proj(emb) + h_proj(x_j)
        torch.testing.assert_close(torch.cat([emb, stream], -1) @ eh.T, emb @ e_w.T + stream @ h_w.T)
        assert dev["mtp.layers.0.e_proj._extra_state"] is None and dev["mtp.layers.0.h_proj._extra_state"] is None
        renamed = {"mapping_weight", "mapping_bias", "eh_proj", "hc_head"}
        for key, value in fork.items():
            if not any(part in key.split(".") for part in renamed):
                assert dev[key] is value, key
        assert not any(k.endswith(("mapping_weight", "mapping_bias")) or ".hc_head." in k or "eh_proj" in k for k in dev)
        # 6 x 2 renamed, 2 x 3 head keys renamed, eh_proj's two keys -> four
        assert len(dev) == len(fork) + 2

    def test_round_trips_are_exact(self):
        fork = synthetic_release_state_dict(3, res_noise=1.0)
        back = upstream_dev_to_fork(fork_to_upstream_dev(fork, N), N)
        assert set(back) == set(fork)
        for key, value in fork.items():
            assert (back[key] is None) if value is None else torch.equal(back[key], value), key
        dev = fork_to_upstream_dev(fork, N)
        again = fork_to_upstream_dev(upstream_dev_to_fork(dev, N), N)
        assert set(again) == set(dev)
        for key, value in dev.items():
            assert (again[key] is None) if value is None else torch.equal(again[key], value), key

    def test_what_does_not_convert_is_refused_by_name(self):
        fork = synthetic_release_state_dict(0)
        norm = dict(fork, **{"decoder.layers.1.post_mlp_layernorm.weight": torch.ones(HIDDEN)})
        with pytest.raises(ValueError, match=r"'decoder.layers.1.post_mlp_layernorm.weight' is a post-sublayer norm"):
            fork_to_upstream_dev(norm, N)
        bias = dict(fork, **{"mtp.layers.0.eh_proj.bias": torch.zeros(HIDDEN)})
        with pytest.raises(ValueError, match=r"'mtp.layers.0.eh_proj.bias'.*no 'bias'"):
            fork_to_upstream_dev(bias, N)
        with pytest.raises(ValueError, match=r"decoder.layers.0.self_attention_hyper_connection.mapping_weight must have n\*n \+ 2n = 15 rows for num_streams=3"):
            fork_to_upstream_dev(fork, 3)
        with pytest.raises(ValueError, match=r"'decoder.layers.0.self_attention_hyper_connection.mapping_proj.weight' already has upstream dev's name"):
            fork_to_upstream_dev(fork_to_upstream_dev(fork, N), N)
        with pytest.raises(ValueError, match=r"'decoder.hc_head_fn' already has upstream dev's name"):
            fork_to_upstream_dev(dict(fork, **{"decoder.hc_head_fn": torch.zeros(N, N * HIDDEN)}), N)
        with pytest.raises(ValueError, match=r"already has the fork's name"):
            upstream_dev_to_fork(fork, N)
        # A head of the wrong rank whose leading dims match (an extra trailing dim, or one too
        # few) is refused by key in both directions, not passed through.
        extra_dim = dict(fork, **{"decoder.hc_head.hc_head_base": torch.zeros(N, 1)})
        with pytest.raises(ValueError, match=rf"fork_to_upstream_dev: decoder.hc_head.hc_head_base must be \[{N}\] for num_streams={N}, got shape \({N}, 1\)"):
            fork_to_upstream_dev(extra_dim, N)
        dev = fork_to_upstream_dev(fork, N)
        for key, bad in (("mtp.layers.0.hc_head_scale", torch.ones(1, 1)), ("decoder.hc_head_fn", torch.zeros(N))):
            with pytest.raises(ValueError, match=rf"upstream_dev_to_fork: {key} must be .* for num_streams={N}, got shape {re.escape(str(tuple(bad.shape)))}"):
                upstream_dev_to_fork(dict(dev, **{key: bad}), N)
        del dev["mtp.layers.0.h_proj.weight"]
        with pytest.raises(ValueError, match=r"mtp.layers.0.h_proj.weight is missing"):
            upstream_dev_to_fork(dev, N)
        with pytest.raises(ValueError, match="post_self_attn_layernorm=True with enable_mhc_connections"):
            fork_config_to_upstream_dev({"enable_mhc_connections": True, "post_self_attn_layernorm": True})


@fork_mhc_only
class TestUpstreamDevNames:
    """The mapping against the release line's real model."""

    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def _model(self):
        torch.manual_seed(0)
        return build_gpt(mhc_config(mtp_num_layers=1, num_moe_experts=None))

    def test_fork_model_writes_the_pinned_names(self):
        sd = self._model().state_dict()
        # The pins are the model's without Transformer Engine; a TE host adds its norms' extra state.
        got = tuple((k, tuple(v.shape) if isinstance(v, torch.Tensor) else None) for k, v in sd.items()
                    if not (k.endswith("._extra_state") and (k, None) not in RELEASE_KEYS))
        assert got == RELEASE_KEYS

    def test_fork_model_round_trips_through_dev_names_exactly(self):
        model = self._model()
        sd = model.state_dict()
        dev = fork_to_upstream_dev(sd, N)
        assert "decoder.hc_head_fn" in dev and "mtp.layers.0.h_proj.weight" in dev
        back = upstream_dev_to_fork(dev, N)
        model.load_state_dict(back, strict=True)
        for key, value in sd.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(back[key], value), key

    def test_config_maps_to_dev_names(self):
        config = mhc_config(mtp_num_layers=1, mhc_sinkhorn_iterations=12)
        assert fork_config_to_upstream_dev(config) == {
            "enable_hyper_connections": True,
            "num_residual_streams": N,
            "mhc_sinkhorn_iterations": 12,
            "mhc_init_gating_factor": config.mhc_init_gating_factor,
            "mhc_recompute_layer_num": None,
        }

    def test_converter_floor_is_the_models(self):
        from megatron.core.transformer import mhc_convert

        assert mhc_convert._EPS == hyper_connection._EPS
