"""moe_activation_in_fp32 off equals pristine upstream (patch moe-activation-in-fp32)."""

from tests.unit_tests.upstream_oracle import MOE_MTP


def test_activation_in_fp32_off_equals_pristine_upstream(upstream_oracle):
    upstream_oracle.compare([MOE_MTP], fork_config={"moe_activation_in_fp32": False})
