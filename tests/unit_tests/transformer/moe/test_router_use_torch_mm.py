"""moe_router_use_torch_mm: router logits from a torch fp32 matmul, not TE's TF32-precision GEMM.

On CPU Transformer Engine is absent, so the TE path is played by a stand-in with the precision of
TE's cuBLASLt GEMM for fp32 operands (operands rounded to TF32, 10 mantissa bits, products summed
in fp32). The CUDA test runs the real TE GEMM where both are present.
"""

import pytest
import torch

from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.moe import moe_utils
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.transformer_config import TransformerConfig
from tests.unit_tests.test_utilities import Utils, unit_device

HIDDEN, EXPERTS = 512, 16
# Bounds relative to the largest |logit|: fp32 rounding of a 512-term dot product stays far
# below 1e-5; TF32 (and bf16) rounding of the operands lands near 1e-4 to 1e-3.
FP32_BOUND, TF32_FLOOR = 1e-5, 5e-5


def _to_tf32(x):
    """Round fp32 to TF32 (10 mantissa bits), round-to-nearest, as TF32 tensor cores read it."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def _te_gemm_stand_in(weight, inp, out_dtype, layout="TN", bias=None, **_):
    assert layout == "TN"
    out = _to_tf32(inp.float()) @ _to_tf32(weight.float()).t()
    if bias is not None:
        out = out + bias.float()
    return (out.to(out_dtype),)


def _router(use_torch_mm, bias=False, **extra):
    """``use_torch_mm=None`` leaves the field at its default."""
    if use_torch_mm is not None:
        extra["moe_router_use_torch_mm"] = use_torch_mm
    config = TransformerConfig(
        num_layers=1,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        num_moe_experts=EXPERTS,
        moe_router_topk=2,
        moe_router_load_balancing_type="none",
        moe_router_dtype="fp32",
        use_cpu_initialization=True,
        add_bias_linear=bias,
        **extra,
    )
    torch.manual_seed(5)
    router = TopKRouter(config=config, pg_collection=ProcessGroupCollection.use_mpu_process_groups())
    if bias:
        with torch.no_grad():
            router.bias.normal_()  # on the CPU, before the move: the same numbers everywhere
    router.set_layer_number(1)
    return router.to(unit_device())


def _hidden(dtype=torch.float32):
    """Router input on :func:`unit_device`, where ``_router`` puts the router; drawn on the CPU."""
    return torch.randn(8, 4, HIDDEN).to(device=unit_device(), dtype=dtype)


def _reference(router, hidden):
    out = hidden.double() @ router.weight.double().t()
    return out if router.bias is None else out + router.bias.double()


def _relative_error(logits, reference):
    return ((logits.double() - reference).abs().max() / reference.abs().max()).item()


class TestRouterUseTorchMM:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
    def test_logits_within_fp32_rounding_of_float64(self, monkeypatch, bias):
        monkeypatch.setattr(moe_utils, "te_general_gemm", _te_gemm_stand_in)
        router = _router(True, bias=bias)
        hidden = _hidden()
        logits = router.gating(hidden)
        assert logits.dtype == torch.float32
        assert _relative_error(logits, _reference(router, hidden)) < FP32_BOUND

    @pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
    def test_te_gemm_without_it_has_tf32_level_error(self, monkeypatch, bias):
        monkeypatch.setattr(moe_utils, "te_general_gemm", _te_gemm_stand_in)
        router = _router(False, bias=bias)
        hidden = _hidden()
        logits = router.gating(hidden)
        assert _relative_error(logits, _reference(router, hidden)) > TF32_FLOOR

    def test_off_by_default(self, monkeypatch):
        monkeypatch.setattr(moe_utils, "te_general_gemm", _te_gemm_stand_in)
        router = _router(None)
        hidden = _hidden()
        assert router.config.moe_router_use_torch_mm is False
        assert _relative_error(router.gating(hidden), _reference(router, hidden)) > TF32_FLOOR

    def test_bf16_operands_give_exact_products_in_fp32(self):
        router = _router(True)
        router.weight.data = router.weight.data.bfloat16()
        hidden = _hidden(torch.bfloat16)
        logits = router.gating(hidden)
        assert logits.dtype == torch.float32
        assert _relative_error(logits, _reference(router, hidden)) < FP32_BOUND

    def test_gradients_reach_input_and_weight_in_their_dtypes(self):
        router = _router(True)
        router.weight.data = router.weight.data.bfloat16()
        hidden = _hidden(torch.bfloat16).requires_grad_(True)
        upstream_grad = torch.randn(8, 4, EXPERTS).to(unit_device())
        router.gating(hidden).backward(upstream_grad)
        assert hidden.grad.dtype == torch.bfloat16 and router.weight.grad.dtype == torch.bfloat16
        expected_wgrad = upstream_grad.reshape(-1, EXPERTS).double().t() @ hidden.detach().reshape(
            -1, HIDDEN
        ).double()
        assert torch.allclose(router.weight.grad.double(), expected_wgrad, rtol=2e-2, atol=1e-1)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
    def test_bias_gets_its_gradient_in_its_dtype(self, dtype):
        router = _router(True, bias=True)
        router.bias.data = router.bias.data.to(dtype)
        upstream_grad = torch.randn(8, 4, EXPERTS).to(unit_device())
        router.gating(_hidden()).backward(upstream_grad)
        assert router.bias.grad is not None and router.bias.grad.dtype == dtype
        expected = upstream_grad.reshape(-1, EXPERTS).double().sum(0)
        assert torch.allclose(router.bias.grad.double(), expected, rtol=1e-2, atol=1e-3)

    @pytest.mark.parametrize("router_dtype", [None, "fp64"])
    def test_refused_unless_router_dtype_is_fp32(self, router_dtype):
        with pytest.raises(ValueError, match="moe_router_use_torch_mm.*moe_router_dtype='fp32'"):
            TransformerConfig(
                num_layers=1,
                hidden_size=32,
                num_attention_heads=4,
                num_moe_experts=4,
                moe_router_dtype=router_dtype,
                moe_router_use_torch_mm=True,
            )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA and Transformer Engine")
def test_real_te_gemm_on_cuda():
    pytest.importorskip("transformer_engine")
    assert moe_utils.te_general_gemm is not None
    Utils.initialize_model_parallel(1, 1)
    try:
        hidden = torch.randn(8, 4, HIDDEN, device="cuda")
        errors = {}
        for flag in (False, True):
            router = _router(flag).cuda()
            errors[flag] = _relative_error(router.gating(hidden), _reference(router, hidden))
        assert errors[True] < FP32_BOUND < errors[False]
    finally:
        Utils.destroy_model_parallel()
