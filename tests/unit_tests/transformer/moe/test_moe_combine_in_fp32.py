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
from megatron.core.transformer.moe import moe_layer
from megatron.core.transformer.transformer_config import TransformerConfig
from tests.unit_tests.test_utilities import Utils, unit_device

HIDDEN, EXPERTS, TOPK, SEQ, BATCH, LATENT = 64, 8, 4, 32, 2, 32


def _layer(dispatcher, flag=None, router_dtype="fp32", **extra):
    """A bf16 MoE layer; ``flag=None`` leaves moe_combine_in_fp32 at its default;
    ``router_dtype=None`` is the default router dtype (the probabilities come out bf16)."""
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
        moe_router_dtype=router_dtype,
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


class _StandInLinear(torch.nn.Module):
    """TELinear's constructor and ``(output, bias)`` return for the latent projections."""

    def __init__(self, in_features, out_features, *, config, bias, **_):
        super().__init__()
        gen = torch.Generator().manual_seed(in_features + 3 * out_features)
        weight = torch.randn(out_features, in_features, generator=gen) / in_features**0.5
        self.weight = torch.nn.Parameter(weight.to(config.params_dtype))

    def forward(self, x):
        return x @ self.weight.t(), None


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

    def test_bf16_router_probs_are_combined_in_fp32_too(self, dispatcher):
        """With the default router dtype the probabilities are bf16: the weighting must still
        happen in fp32 (a bf16 product rounds before the sum)."""
        _, output, seen = _run(_layer(dispatcher, True, router_dtype=None))
        assert seen["probs"].dtype == torch.bfloat16
        exact = _reference(seen).reshape(output.shape)
        matches = (output == exact.to(torch.bfloat16)).double().mean().item()
        assert matches > 0.99, f"only {matches:.3f} of the output is the single rounding"

    def test_latent_projection_and_shared_experts_take_the_rounded_combine(
        self, dispatcher, monkeypatch
    ):
        """With moe_latent_size the fp32 combine is rounded to bf16 before fc2_latent_proj, and
        the shared experts' bf16 output is added to the bf16 result."""
        monkeypatch.setattr(moe_layer, "HAVE_TE", True)
        monkeypatch.setattr(moe_layer, "TELinear", _StandInLinear)
        layer = _layer(
            dispatcher, True, moe_latent_size=LATENT, moe_shared_expert_intermediate_size=48
        )
        assert layer.shared_experts is not None
        seen = {}
        layer.fc2_latent_proj.register_forward_pre_hook(lambda m, a: seen.update(latent_in=a[0]))
        layer.shared_experts.register_forward_hook(lambda m, a, out: seen.update(shared=out))
        _, output, routed = _run(layer)
        exact = _reference(routed)
        assert seen["latent_in"].dtype == torch.bfloat16
        assert (seen["latent_in"].reshape(exact.shape) == exact.to(torch.bfloat16)).double().mean() > 0.99
        projected, _ = layer.fc2_latent_proj(seen["latent_in"])
        assert output.dtype == torch.bfloat16
        assert torch.equal(output, projected + seen["shared"])

    def test_inference_optimized_dispatcher_weights_in_the_experts(self, dispatcher):
        """On the inference-optimized dispatcher's path the experts weight their outputs (the
        inference experts do), with or without the flag: same output, bf16."""
        from megatron.core.inference.utils import InferenceMode

        outputs = {}
        for flag in (False, True):
            layer = _layer(dispatcher, flag)
            # The inference dispatcher stands in as the training one (NCCL/NVLS need GPUs); the
            # inference path calls the experts with the routing map.
            layer._training_token_dispatcher = layer._inference_token_dispatcher = (
                layer.token_dispatcher
            )
            plain = layer.experts.forward
            layer.experts.forward = lambda x, counts, probs, routing_map=None: plain(x, counts, probs)
            with InferenceMode.active():
                _, outputs[flag], seen = _run(layer)
            routed = seen["probs"][seen["map"]]
            assert torch.equal(seen["expert_probs"].sort().values, routed.sort().values)
        assert outputs[True].dtype == torch.bfloat16
        assert torch.equal(outputs[True], outputs[False])

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
