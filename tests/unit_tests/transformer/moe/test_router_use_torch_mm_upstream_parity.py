"""moe_router_use_torch_mm off equals pristine upstream (patch moe-router-use-torch-mm).

On the CPU both sides' gating GEMM is an exact fp32 matmul, so the flag changes nothing there; the
scenarios run the router's GEMM at Transformer Engine's precision for fp32 operands (the
``router_gemm="tf32"`` stand-in), where the flag matters, in a bf16 model with SequentialMLP and
grouped experts under both dispatchers. The same scenarios with the flag on must differ from
upstream, so the parity check is able to fail.
"""

import pytest

from tests.unit_tests.upstream_oracle import MOE, MTP, assert_parity_can_fail, gpt_spec, moe_bf16_specs

MOE_MTP_FP32_ROUTER = gpt_spec("MoE+MTP fp32 router", **MOE, **MTP, moe_router_dtype="fp32")
WHERE_IT_MATTERS = [
    dict(spec, name=spec["name"] + " TE-precision router GEMM",
         options=dict(spec["options"], router_gemm="tf32"))
    for spec in moe_bf16_specs(moe_router_dtype="fp32")
]


@pytest.mark.slow
def test_torch_mm_off_equals_pristine_upstream(upstream_oracle):
    upstream_oracle.compare(
        [MOE_MTP_FP32_ROUTER, *WHERE_IT_MATTERS], fork_config={"moe_router_use_torch_mm": False}
    )


@pytest.mark.slow
def test_parity_fails_with_the_feature_forced_on(upstream_oracle):
    assert_parity_can_fail(upstream_oracle, WHERE_IT_MATTERS, {"moe_router_use_torch_mm": True})
