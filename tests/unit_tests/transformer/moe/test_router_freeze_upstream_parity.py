"""Router freeze settings off equal pristine upstream (patch moe-router-freeze)."""

from tests.unit_tests.upstream_oracle import MOE, MTP, gpt_spec

MOE_MTP_EXPERT_BIAS = gpt_spec(
    "MoE+MTP expert bias", **MOE, **MTP, moe_router_enable_expert_bias=True,
    moe_router_score_function="sigmoid",
)  # fmt: skip


def test_freeze_off_equals_pristine_upstream(upstream_oracle):
    upstream_oracle.compare(
        [MOE_MTP_EXPERT_BIAS],
        fork_config={"moe_router_freeze_weight": False, "moe_router_freeze_expert_bias": False},
    )
