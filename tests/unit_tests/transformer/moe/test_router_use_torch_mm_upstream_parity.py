"""moe_router_use_torch_mm off equals pristine upstream (patch moe-router-use-torch-mm)."""

from tests.unit_tests.upstream_oracle import MOE, MTP, gpt_spec

MOE_MTP_FP32_ROUTER = gpt_spec("MoE+MTP fp32 router", **MOE, **MTP, moe_router_dtype="fp32")


def test_torch_mm_off_equals_pristine_upstream(upstream_oracle):
    upstream_oracle.compare([MOE_MTP_FP32_ROUTER], fork_config={"moe_router_use_torch_mm": False})
