"""INT4 fake QAT for MoE expert weights (patch moe-int4-fake-qat)."""

import pytest
import torch

from megatron.core.model_parallel_config import ModelParallelConfig
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.moe import int4_fake_qat as qat
from megatron.core.transformer.moe.experts import SequentialMLP
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import (
    build_gpt,
    causal_batch,
    tiny_moe_mtp_config,
)
from tests.unit_tests.test_utilities import Utils, unit_device

ENV_VARS = (qat.FLAG_ENV, qat.GROUP_SIZE_ENV)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def moe_config(**overrides):
    values = dict(
        num_layers=1,
        hidden_size=32,
        num_attention_heads=4,
        num_moe_experts=4,
        moe_router_topk=2,
        use_cpu_initialization=True,
        add_bias_linear=False,
    )
    values.update(overrides)
    return TransformerConfig(**values)


def reference_groups(weight, group_size):
    """Yield (row, column slice) for every (row, group) pair, the last group possibly short."""
    rows, cols = weight.shape
    for r in range(rows):
        for start in range(0, cols, group_size):
            yield r, slice(start, min(start + group_size, cols))


class TestInt4Quantizer:
    def test_values_on_int4_grid_per_row_and_group(self):
        torch.manual_seed(0)
        weight = torch.randn(6, 200) * torch.logspace(-3, 1, 6)[:, None]
        q = qat.int4_quantize_dequantize(weight, 128)
        assert q.shape == weight.shape and q.dtype == weight.dtype
        widths = set()
        for r, cols in reference_groups(weight, 128):
            group, qgroup = weight[r, cols], q[r, cols]
            widths.add(group.numel())
            scale = max(group.abs().max().item() / 7, 1e-5)
            k = qgroup / scale
            k_int = torch.round(k)
            torch.testing.assert_close(k, k_int, rtol=0, atol=1e-4)
            assert k_int.abs().max().item() == 7  # the absmax element sits on +-7
            assert (k_int.abs() <= 7).all()
            assert ((qgroup - group).abs() <= scale / 2 * (1 + 1e-5)).all()
        assert widths == {128, 72}

    def test_ragged_last_group_has_its_own_scale(self):
        torch.manual_seed(1)
        weight = torch.cat([torch.randn(6, 128) * 100.0, torch.randn(6, 72) * 0.01], dim=1)
        q = qat.int4_quantize_dequantize(weight, 128)
        # The tail group is quantized exactly as if it were alone, unaffected by the padding or
        # by the large first group.
        assert torch.equal(q[:, 128:], qat.int4_quantize_dequantize(weight[:, 128:], 72))
        assert torch.equal(q[:, :128], qat.int4_quantize_dequantize(weight[:, :128], 128))
        assert (q[:, 128:] != 0).any()
        # A group size larger than the row is one ragged group per row.
        one = qat.int4_quantize_dequantize(weight[:, 128:], 1000)
        assert torch.equal(one, q[:, 128:])

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_ragged_result_is_a_contiguous_matrix(self, dtype):
        # Transformer Engine's grouped GEMM reads the weights it gets as dense row-major memory:
        # a strided view of the padded groups (what slicing off the padding gives when the dtype
        # does not change) made it multiply garbage (TE 2.20.2, float32 expert weights).
        weight = torch.randn(32, 64, dtype=dtype)
        q = qat.int4_quantize_dequantize(weight, 48)
        assert q.is_contiguous() and q.stride() == (64, 1)
        assert torch.equal(q.clone(memory_format=torch.contiguous_format), q)

    def test_zero_group_stays_zero_and_scale_is_clamped(self):
        weight = torch.zeros(2, 8)
        weight[1, :4] = 1e-7
        q = qat.int4_quantize_dequantize(weight, 4)
        assert torch.isfinite(q).all()
        assert torch.equal(q, torch.zeros_like(q))  # 1e-7 / 1e-5 rounds to 0

    def test_bf16_weight_keeps_dtype(self):
        weight = torch.randn(4, 40).to(torch.bfloat16)
        q = qat.int4_quantize_dequantize(weight, 16)
        assert q.dtype == torch.bfloat16
        ref = qat.int4_quantize_dequantize(weight.float(), 16).to(torch.bfloat16)
        assert torch.equal(q, ref)

    def test_gradient_is_exactly_straight_through(self):
        torch.manual_seed(2)
        weight = torch.randn(6, 200, requires_grad=True)
        qat.int4_fake_quantize(weight, 128).sum().backward()
        assert torch.equal(weight.grad, torch.ones_like(weight))
        weight.grad = None
        upstream = torch.randn(6, 200)
        out = qat.int4_fake_quantize(weight, 128)
        assert torch.equal(out, qat.int4_quantize_dequantize(weight, 128))
        (out * upstream).sum().backward()
        assert torch.equal(weight.grad, upstream)

    @pytest.mark.parametrize("group_size", [0, -3, 2.5])
    def test_bad_group_size_is_rejected(self, group_size):
        with pytest.raises(ValueError, match="group size"):
            qat.int4_quantize_dequantize(torch.randn(2, 8), group_size)

    def test_non_matrix_is_rejected(self):
        with pytest.raises(ValueError, match="2-D"):
            qat.int4_quantize_dequantize(torch.randn(2, 3, 4), 4)


class TestInt4FakeQatConfig:
    def test_defaults_off(self):
        config = moe_config()
        assert config.moe_int4_fake_qat is False
        assert config.moe_int4_fake_qat_group_size == 128

    def test_environment_variables_are_honoured(self, monkeypatch):
        monkeypatch.setenv(qat.FLAG_ENV, "1")
        monkeypatch.setenv(qat.GROUP_SIZE_ENV, "32")
        config = moe_config()
        assert config.moe_int4_fake_qat is True
        assert config.moe_int4_fake_qat_group_size == 32

    def test_explicit_group_size_wins_over_environment(self, monkeypatch):
        monkeypatch.setenv(qat.GROUP_SIZE_ENV, "32")
        config = moe_config(moe_int4_fake_qat=True, moe_int4_fake_qat_group_size=64)
        assert config.moe_int4_fake_qat_group_size == 64

    def test_environment_flag_zero_does_not_enable(self, monkeypatch):
        monkeypatch.setenv(qat.FLAG_ENV, "0")
        assert moe_config().moe_int4_fake_qat is False

    @pytest.mark.parametrize(
        "name,value,match",
        [(qat.FLAG_ENV, "maybe", qat.FLAG_ENV), (qat.GROUP_SIZE_ENV, "big", qat.GROUP_SIZE_ENV)],
    )
    def test_bad_environment_values_are_rejected(self, monkeypatch, name, value, match):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=match):
            moe_config()

    def test_bad_group_size_field_is_rejected(self):
        with pytest.raises(ValueError, match="moe_int4_fake_qat_group_size"):
            moe_config(moe_int4_fake_qat=True, moe_int4_fake_qat_group_size=0)

    @pytest.mark.parametrize(
        "field",
        [
            "gradient_accumulation_fusion",
            "delay_wgrad_compute",
            "overlap_dispatch_backward_with_experts_wgrad",
            "use_transformer_engine_op_fuser",
        ],
    )
    def test_fused_wgrad_configs_are_rejected(self, field):
        with pytest.raises(ValueError, match=f"moe_int4_fake_qat cannot be combined with {field}"):
            moe_config(moe_int4_fake_qat=True, **{field: True})

    def test_runtime_guards(self):
        config = moe_config(moe_int4_fake_qat=True)
        weights = [torch.randn(4, 8)]
        with pytest.raises(ValueError, match="delay"):
            qat.maybe_int4_fake_quantize_weights(weights, config, delay_wgrad_compute=True)
        config.gradient_accumulation_fusion = True  # set after validation, still caught
        with pytest.raises(ValueError, match="gradient_accumulation_fusion"):
            qat.maybe_int4_fake_quantize_weights(weights, config)

    def test_megatron_fsdp_is_rejected(self):
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.distributed.fsdp import mcore_fsdp_adapter

        if not mcore_fsdp_adapter.HAVE_MEGATRON_FSDP:
            pytest.skip("megatron_fsdp is not importable")
        match = "moe_int4_fake_qat is not supported with Megatron-FSDP"
        with pytest.raises(ValueError, match=match):
            mcore_fsdp_adapter.FullyShardedDataParallel(
                moe_config(moe_int4_fake_qat=True),
                DistributedDataParallelConfig(use_megatron_fsdp=True),
                torch.nn.Linear(2, 2),
            )

    def test_flag_off_is_a_no_op_for_the_grouped_getter(self):
        config = moe_config()
        weights = [torch.randn(4, 8), torch.randn(4, 8)]
        assert qat.maybe_int4_fake_quantize_weights(weights, config) is weights
        config_on = moe_config(moe_int4_fake_qat=True, moe_int4_fake_qat_group_size=4)
        out = qat.maybe_int4_fake_quantize_weights(weights, config_on)
        for w, q in zip(weights, out):
            assert torch.equal(q, qat.int4_quantize_dequantize(w, 4))

    def test_dense_model_ignores_the_environment_flag(self, monkeypatch):
        monkeypatch.setenv(qat.FLAG_ENV, "1")
        config = TransformerConfig(
            num_layers=1, hidden_size=32, num_attention_heads=4, gradient_accumulation_fusion=True
        )
        # No MoE: nothing to quantize, so the fused-wgrad guard does not apply.
        assert config.moe_int4_fake_qat is True and config.gradient_accumulation_fusion is True


class _ForeignLinear(torch.nn.Module):
    """An expert linear that does not apply the quantizer (like a TE linear)."""

    def __init__(self, input_size, output_size, **kwargs):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(output_size, input_size))


def _linear(x, weight):
    """``x W^T`` as Megatron's local linears compute it (``matmul`` with ``weight.t()``), so that a
    CUDA GEMM compares bit for bit too."""
    return torch.matmul(x, weight.t())


class TestInt4FakeQatLocalExperts:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        torch.manual_seed(1234)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.parametrize("linear_cls", [ColumnParallelLinear, RowParallelLinear])
    @pytest.mark.parametrize("flag", [False, True])
    def test_expert_linear_forward(self, linear_cls, flag):
        config = moe_config(moe_int4_fake_qat=flag, moe_int4_fake_qat_group_size=24)
        kwargs = dict(
            config=config,
            init_method=torch.nn.init.normal_,
            bias=False,
            skip_bias_add=True,
            is_expert=True,
        )
        if linear_cls is ColumnParallelLinear:
            kwargs["gather_output"] = False
        else:
            kwargs["input_is_parallel"] = True
        device = unit_device()
        linear = linear_cls(32, 16, **kwargs).to(device)
        x = torch.randn(5, 2, 32).to(device)
        out, _ = linear(x)
        weight = qat.int4_quantize_dequantize(linear.weight, 24) if flag else linear.weight
        assert torch.equal(out, _linear(x, weight))
        if flag:
            assert not torch.equal(out, _linear(x, linear.weight))
        # Non-expert linears are never quantized.
        kwargs["is_expert"] = False
        dense = linear_cls(32, 16, **kwargs).to(device)
        out, _ = dense(x)
        assert torch.equal(out, _linear(x, dense.weight))
        # Nor is an expert linear built from a plain ModelParallelConfig (no QAT fields at all).
        kwargs.update(config=ModelParallelConfig(), is_expert=True)
        plain = linear_cls(32, 16, **kwargs).to(device)
        out, _ = plain(x)
        assert torch.equal(out, _linear(x, plain.weight))

    def test_sequential_mlp_rejects_experts_without_the_quantizer(self):
        config = moe_config(moe_int4_fake_qat=True)
        submodules = MLPSubmodules(linear_fc1=_ForeignLinear, linear_fc2=_ForeignLinear)
        pgs = ProcessGroupCollection.use_mpu_process_groups()
        with pytest.raises(ValueError, match="local_experts.0.linear_fc1 is _ForeignLinear"):
            SequentialMLP(2, config, submodules, pg_collection=pgs)
        # Flag off: any linear is accepted, as upstream.
        SequentialMLP(2, moe_config(), submodules, pg_collection=pgs)

    @pytest.mark.slow
    def test_gpt_moe_uses_quantized_expert_weights_and_trains(self):
        group = 24  # hidden 32 -> one full and one ragged group for linear_fc1
        no_dropout = dict(hidden_dropout=0.0, attention_dropout=0.0)
        model_on = build_gpt(
            tiny_moe_mtp_config(
                moe_int4_fake_qat=True, moe_int4_fake_qat_group_size=group, **no_dropout
            )
        )
        model_ref = build_gpt(tiny_moe_mtp_config(**no_dropout))
        model_ref.load_state_dict(model_on.state_dict())
        expert_weights = [n for n, _ in model_on.named_parameters() if ".local_experts." in n]
        assert expert_weights and all(n.endswith(".weight") for n in expert_weights)
        # The reference stores the dequantized expert weights and runs with the flag off.
        ref_params = dict(model_ref.named_parameters())
        with torch.no_grad():
            for n in expert_weights:
                ref_params[n].copy_(qat.int4_quantize_dequantize(ref_params[n], group))
        tokens, position_ids, mask = causal_batch()
        loss_on = model_on(tokens, position_ids, mask, labels=tokens).mean()
        loss_ref = model_ref(tokens, position_ids, mask, labels=tokens).mean()
        assert torch.equal(loss_on, loss_ref)
        loss_on.backward()
        loss_ref.backward()
        on_params = dict(model_on.named_parameters())
        for n in expert_weights:  # straight-through: same gradient as the dequantized weights
            torch.testing.assert_close(on_params[n].grad, ref_params[n].grad, rtol=0, atol=0)

        # A few optimizer steps on a fixed batch lower the loss.
        model_on.zero_grad()
        before = {n: on_params[n].detach().clone() for n in expert_weights}
        opt = torch.optim.Adam(model_on.parameters(), lr=3e-3)
        losses = []
        for _ in range(8):
            opt.zero_grad()
            loss = model_on(tokens, position_ids, mask, labels=tokens).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < losses[0] - 0.05, losses
        changed = [n for n in expert_weights if not torch.equal(before[n], on_params[n])]
        assert changed == expert_weights


@pytest.mark.gpu
class TestInt4FakeQatTEGroupedLinear:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        torch.manual_seed(1234)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_forward_and_weight_grads_match_dequantized_reference(self):
        pytest.importorskip("transformer_engine")
        from megatron.core.extensions.transformer_engine import TEColumnParallelGroupedLinear

        group = 48  # in_features 64 -> one full and one ragged group
        config = moe_config(
            moe_int4_fake_qat=True,
            moe_int4_fake_qat_group_size=group,
            use_cpu_initialization=False,
            moe_grouped_gemm=True,
            params_dtype=torch.float32,
        )
        layer = TEColumnParallelGroupedLinear(
            2,
            64,
            32,
            config=config,
            init_method=torch.nn.init.normal_,
            bias=False,
            skip_bias_add=False,
            is_expert=True,
        ).cuda()
        weights = [layer.weight0, layer.weight1]
        m_splits = [5, 11]
        x = torch.randn(sum(m_splits), 64, device="cuda", requires_grad=True)
        out, _ = layer(x, m_splits)
        grad_out = torch.randn_like(out)
        out.backward(grad_out)

        ref_w = [w.detach().clone().requires_grad_() for w in weights]
        xs = torch.split(x.detach(), m_splits)
        ref = torch.cat([xi @ qat.int4_fake_quantize(w, group).t() for xi, w in zip(xs, ref_w)])
        ref.backward(grad_out)
        # Tolerances allow for TF32 inside TE's GEMMs; int4 rounding changes outputs by O(1).
        tol = dict(rtol=1e-2, atol=2e-2)
        torch.testing.assert_close(out, ref, **tol)
        unquantized = torch.cat([xi @ w.detach().t() for xi, w in zip(xs, weights)])
        assert (out - unquantized).abs().max() > 0.5
        for w, rw in zip(weights, ref_w):
            torch.testing.assert_close(w.grad, rw.grad, **tol)
        # Straight-through: the reference grad is grad_out^T x, independent of quantization.
        g0 = torch.split(grad_out, m_splits)[0].t() @ xs[0]
        torch.testing.assert_close(weights[0].grad, g0, **tol)
