"""mHC weight conversion (upstream main, DeepSeek-V4 layout) and the Sinkhorn schedules.

The three schedules are re-written here in float64, independently of the fork's code, from
their descriptions (issue 25): what a converted checkpoint reproduces exactly, what only in the
Sinkhorn limit, and how far apart they are at the 20 iterations models train with.
"""

import pytest
import torch

from megatron.core.transformer.hyper_connection import sinkhorn_log
from megatron.core.transformer.mhc_convert import (
    deepseek_v4_sublayer_to_fork,
    fork_to_upstream_main,
    mean_head,
    upstream_main_to_fork,
)
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import build_gpt, causal_batch
from tests.unit_tests.test_utilities import Utils
from tests.unit_tests.transformer.test_hyper_connection import N, mhc_config

n = 4


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
    def test_fork_schedule_is_the_documented_one(self):
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
