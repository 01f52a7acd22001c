"""moe_activation_in_fp32: a routed expert's activation times its routing probability is computed in
fp32 and rounded once to the GEMM dtype, so the fc2 input is the bf16 rounding of the exact value.

Both expert implementations are checked on CPU: the MLP that SequentialMLP runs per expert, and
TEGroupedMLP with a stand-in grouped linear (Transformer Engine is absent); the fc2 input is
compared with a float64 evaluation of the same fc1 output and probabilities.
"""

import pytest
import torch
import torch.nn.functional as F

from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.moe.experts import GroupedMLPSubmodules, TEGroupedMLP
from megatron.core.transformer.transformer_config import TransformerConfig
from tests.unit_tests.test_utilities import Utils

HIDDEN, FFN, TOKENS, EXPERTS = 64, 96, 256, 4

PATHS = {
    "swiglu": dict(gated_linear_unit=True, activation_func=F.silu),
    "swiglu_fused": dict(gated_linear_unit=True, activation_func=F.silu, bias_activation_fusion=True),
    "gelu": dict(gated_linear_unit=False, activation_func=F.gelu),
}
# A biased fc1 on the grouped experts only: the MLP's biased expert path adds its fc2 bias in place
# on a view, which autograd refuses on CPU, flag or no flag.
GROUPED_PATHS = dict(
    PATHS, swiglu_bias=dict(gated_linear_unit=True, activation_func=F.silu, add_bias_linear=True)
)
# The fused weighted SwiGLU already rounds once on CPU; the flag must keep it so.
DISCRIMINATING = ("swiglu", "gelu", "swiglu_bias")


def _config(flag, **path):
    values = dict(
        num_layers=1,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        num_moe_experts=EXPERTS,
        moe_ffn_hidden_size=FFN,
        ffn_hidden_size=FFN,
        add_bias_linear=False,
        use_cpu_initialization=True,
        bf16=True,
        params_dtype=torch.bfloat16,
    )
    if flag is not None:  # None: the field at its default
        values["moe_activation_in_fp32"] = flag
    values.update(path)
    return TransformerConfig(**values)


def _reference(config, fc1_out, bias, probs):
    """The activation times the probability in float64, then one rounding to bf16."""
    x = fc1_out.double() if bias is None else fc1_out.double() + bias.double()
    if config.gated_linear_unit:
        x_glu, x_linear = torch.chunk(x, 2, dim=-1)
        act = config.activation_func(x_glu) * x_linear
    else:
        act = config.activation_func(x)
    return act * probs.double().reshape(-1, 1)


def _assert_single_rounding(fc2_in, exact, flag, path):
    """With the flag fc2_in is the bf16 rounding of ``exact`` (ties aside); without it, not."""
    assert fc2_in.dtype == torch.bfloat16
    matches = (fc2_in == exact.to(torch.bfloat16)).double().mean().item()
    if flag:
        assert matches > 0.99, f"only {matches:.3f} of the fc2 input is the single rounding"
    elif path in DISCRIMINATING:
        assert matches < 0.95, f"{matches:.3f} already matched: the test cannot tell the paths apart"


def _capture(module):
    seen = {}
    module.linear_fc1.register_forward_hook(lambda m, a, out: seen.update(fc1=out))
    module.linear_fc2.register_forward_pre_hook(lambda m, a: seen.update(fc2_in=a[0]))
    return seen


class _StandInGroupedLinear(torch.nn.Module):
    """Per-expert bf16 matmuls with TE GroupedLinear's call signature (bias returned separately)."""

    def __init__(self, num_gemms, in_features, out_features, *, config, bias, skip_bias_add, **_):
        super().__init__()
        self.skip_bias_add = skip_bias_add
        gen = torch.Generator().manual_seed(in_features * 7 + out_features)
        self.weight = torch.nn.Parameter(
            (torch.randn(num_gemms, out_features, in_features, generator=gen) * 0.2).bfloat16()
        )
        self.bias = (
            torch.nn.Parameter(torch.randn(num_gemms, out_features, generator=gen).bfloat16())
            if bias
            else None
        )

    def forward(self, x, tokens_per_expert):
        chunks = torch.split(x, tokens_per_expert)
        out = torch.cat([c @ w.t() for c, w in zip(chunks, self.weight)])
        if self.bias is None:
            return out, None
        bias = torch.cat([b.expand(n, -1) for b, n in zip(self.bias, tokens_per_expert)])
        return (out, bias) if self.skip_bias_add else (out + bias, None)


class TestMoEActivationInFp32:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.parametrize("flag", [True, False], ids=["fp32", "default"])
    @pytest.mark.parametrize("path", sorted(PATHS))
    def test_expert_mlp_rounds_once(self, path, flag):
        config = _config(flag, **PATHS[path])
        torch.manual_seed(11)
        mlp = MLP(
            config,
            MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
            is_expert=True,
            ffn_hidden_size=FFN,
        )
        if mlp.linear_fc1.bias is not None:
            with torch.no_grad():
                mlp.linear_fc1.bias.normal_()
        seen = _capture(mlp)
        hidden = torch.randn(TOKENS, HIDDEN).bfloat16()
        probs = torch.rand(TOKENS)
        mlp(hidden, per_token_scale=probs)
        fc1_out, bias = seen["fc1"]
        exact = _reference(config, fc1_out, bias, probs)
        _assert_single_rounding(seen["fc2_in"], exact, flag, path)

    def test_off_by_default(self):
        config = _config(None, **PATHS["swiglu"])
        assert config.moe_activation_in_fp32 is False
        torch.manual_seed(11)
        mlp = MLP(
            config,
            MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
            is_expert=True,
            ffn_hidden_size=FFN,
        )
        seen = _capture(mlp)
        probs = torch.rand(TOKENS)
        mlp(torch.randn(TOKENS, HIDDEN).bfloat16(), per_token_scale=probs)
        fc1_out, bias = seen["fc1"]
        exact = _reference(config, fc1_out, bias, probs)
        _assert_single_rounding(seen["fc2_in"], exact, False, "swiglu")

    def test_dense_mlp_is_untouched(self):
        """Without per_token_scale (dense layers, shared experts) the flag changes nothing."""
        outputs = []
        for flag in (False, True):
            torch.manual_seed(11)
            mlp = MLP(
                _config(flag, **PATHS["swiglu"]),
                MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
            )
            seen = _capture(mlp)
            mlp(torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(3)).bfloat16())
            outputs.append(seen["fc2_in"])
        assert torch.equal(outputs[0], outputs[1])

    @pytest.mark.parametrize("flag", [True, False], ids=["fp32", "default"])
    @pytest.mark.parametrize("path", sorted(GROUPED_PATHS))
    def test_grouped_experts_round_once(self, path, flag):
        config = _config(flag, **GROUPED_PATHS[path])
        experts = TEGroupedMLP(
            EXPERTS,
            config,
            GroupedMLPSubmodules(
                linear_fc1=_StandInGroupedLinear, linear_fc2=_StandInGroupedLinear
            ),
            pg_collection=ProcessGroupCollection.use_mpu_process_groups(),
        )
        seen = _capture(experts)
        hidden = torch.randn(TOKENS, HIDDEN).bfloat16()
        probs = torch.rand(TOKENS)
        tokens_per_expert = torch.tensor([TOKENS // EXPERTS] * EXPERTS)
        experts(hidden, tokens_per_expert, probs)
        fc1_out, bias = seen["fc1"]
        exact = _reference(config, fc1_out, bias, probs)
        _assert_single_rounding(seen["fc2_in"], exact, flag, path)

    def test_refused_with_probs_on_input(self):
        with pytest.raises(ValueError, match="moe_activation_in_fp32.*moe_apply_probs_on_input"):
            _config(True, moe_apply_probs_on_input=True, moe_router_topk=1)

    def test_refused_with_te_op_fuser(self):
        with pytest.raises(ValueError, match="moe_activation_in_fp32.*use_transformer_engine_op"):
            _config(True, use_transformer_engine_op_fuser=True)
