"""moe_combine_in_fp32: the experts return unweighted outputs, and the MoE layer weights them by their
routing probabilities and sums the top-k in fp32 at the combine, rounding once to bf16.

A bf16 MoE layer (SequentialMLP experts, allgather and alltoall dispatchers, one CPU rank): its
output must be the bf16 rounding of the float64 sum over each token's experts of probability times
the expert's (captured) output.
"""

import contextlib

import pytest
import torch

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_config import TransformerConfig
from tests.unit_tests.test_utilities import Utils, unit_device

HIDDEN, EXPERTS, TOPK, SEQ, BATCH = 64, 8, 4, 32, 2


def _layer(dispatcher, flag=None, **extra):
    """A bf16 MoE layer; ``flag=None`` leaves moe_combine_in_fp32 at its default."""
    if flag is not None:
        extra["moe_combine_in_fp32"] = flag
    config = TransformerConfig(
        num_layers=1,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        num_moe_experts=EXPERTS,
        moe_router_topk=TOPK,
        moe_ffn_hidden_size=96,
        moe_token_dispatcher_type=dispatcher,
        moe_router_load_balancing_type="none",
        moe_router_dtype="fp32",
        add_bias_linear=False,
        use_cpu_initialization=True,
        bf16=True,
        params_dtype=torch.bfloat16,
        **extra,
    )
    spec = get_gpt_layer_local_spec(num_experts=EXPERTS, moe_grouped_gemm=False)
    torch.manual_seed(21)
    layer = spec.submodules.mlp(config=config, layer_number=1)
    # On a CUDA machine the router moves its gate to the current device at its first gating call,
    # CPU initialization or not; the whole layer goes there.
    return layer.to(unit_device())


def _run(layer):
    seen = {}
    layer.router.register_forward_hook(lambda m, a, out: seen.update(probs=out[0], map=out[1]))
    layer.experts.register_forward_hook(
        lambda m, a, out: seen.update(expert_probs=a[2], expert_out=out[0])
    )
    gen = torch.Generator().manual_seed(4)
    hidden = torch.randn(SEQ, BATCH, HIDDEN, generator=gen).bfloat16()
    hidden = hidden.to(unit_device()).requires_grad_(True)
    output, _ = layer(hidden)
    return hidden, output, seen


def _reference(seen):
    """float64 sum over each token's experts of prob x expert output (rows in permuted order:
    expert by expert, tokens ascending, which is the order of both dispatchers on one rank)."""
    probs, routing_map, expert_out = seen["probs"], seen["map"], seen["expert_out"]
    tokens = routing_map.T.nonzero()[:, 1]
    experts = routing_map.T.nonzero()[:, 0]
    weights = probs.double()[tokens, experts].unsqueeze(-1)
    ref = torch.zeros(probs.shape[0], expert_out.shape[-1], dtype=torch.float64, device=probs.device)
    return ref.index_add_(0, tokens, expert_out.double() * weights)


@pytest.fixture(autouse=True)
def _cpu_streams(monkeypatch):
    """The alltoall dispatcher makes a CUDA side stream; on CPU, the harness's stand-in (for this
    test only: the harness's own installer patches torch.cuda for the whole process)."""
    if not torch.cuda.is_available():
        from megatron.core.cpu_harness import _CPUStream

        for name in ("Stream", "current_stream", "default_stream"):
            monkeypatch.setattr(torch.cuda, name, _CPUStream)
        monkeypatch.setattr(torch.cuda, "stream", contextlib.nullcontext)


@pytest.mark.parametrize("dispatcher", ["allgather", "alltoall"])
class TestMoECombineInFp32:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_output_is_one_rounding_of_the_weighted_sum(self, dispatcher):
        _, output, seen = _run(_layer(dispatcher, True))
        assert torch.equal(seen["expert_probs"], torch.ones_like(seen["expert_probs"]))
        assert seen["expert_out"].dtype == torch.bfloat16 and output.dtype == torch.bfloat16
        exact = _reference(seen).reshape(output.shape)
        matches = (output == exact.to(torch.bfloat16)).double().mean().item()
        assert matches > 0.99, f"only {matches:.3f} of the output is the single rounding"

    def test_inference_flag_alone_keeps_the_fp32_combine(self, dispatcher):
        """InferenceMode without the inference dispatcher runs the training path (an RL log-prob
        pass beside a rollout engine): the combine stays fp32."""
        from megatron.core.inference.utils import InferenceMode

        _, expected, _ = _run(_layer(dispatcher, True))
        with InferenceMode.active():
            _, output, seen = _run(_layer(dispatcher, True))
        assert torch.equal(seen["expert_probs"], torch.ones_like(seen["expert_probs"]))
        assert torch.equal(output, expected)

    def test_off_by_default_weights_in_the_experts(self, dispatcher):
        layer = _layer(dispatcher)
        assert layer.config.moe_combine_in_fp32 is False
        _, output, seen = _run(layer)
        routed = seen["probs"][seen["map"]]
        assert torch.equal(seen["expert_probs"].sort().values, routed.sort().values)

    def test_gradients_match_the_default_path(self, dispatcher):
        grads = {}
        for flag in (False, True):
            layer = _layer(dispatcher, flag)
            hidden, output, _ = _run(layer)
            output.float().square().sum().backward()
            grads[flag] = (hidden.grad.double(), layer.router.weight.grad.double())
        for default, fp32 in zip(grads[False], grads[True]):
            assert fp32.abs().max() > 0
            assert (fp32 - default).norm() / default.norm() < 2e-2

    def test_refused_where_it_cannot_hold(self, dispatcher):
        with pytest.raises(ValueError, match="moe_combine_in_fp32.*moe_apply_probs_on_input"):
            _layer(dispatcher, True, moe_apply_probs_on_input=True)


def test_refused_with_the_flex_dispatcher():
    with pytest.raises(ValueError, match="moe_combine_in_fp32.*'flex'"):
        TransformerConfig(
            num_layers=1,
            hidden_size=HIDDEN,
            num_attention_heads=4,
            num_moe_experts=EXPERTS,
            moe_token_dispatcher_type="flex",
            moe_combine_in_fp32=True,
        )
