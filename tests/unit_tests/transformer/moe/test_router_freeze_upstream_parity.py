"""Router freeze settings off equal pristine upstream (patch moe-router-freeze).

The scenario runs the end-of-batch expert-bias update after the backward, where
moe_router_freeze_expert_bias would matter (the gate weight's gradient shows
moe_router_freeze_weight). Each flag forced on must make the parity check fail.
"""

import pytest

from tests.unit_tests.upstream_oracle import MOE, MTP, assert_parity_can_fail, gpt_spec

MOE_MTP_EXPERT_BIAS = gpt_spec(
    "MoE+MTP expert bias, updated", options={"update_expert_bias": True}, **MOE, **MTP,
    moe_router_enable_expert_bias=True, moe_router_score_function="sigmoid",
)  # fmt: skip
OFF = {"moe_router_freeze_weight": False, "moe_router_freeze_expert_bias": False}


@pytest.mark.slow
def test_freeze_off_equals_pristine_upstream(upstream_oracle):
    upstream_oracle.compare([MOE_MTP_EXPERT_BIAS], fork_config=OFF)


@pytest.mark.slow
@pytest.mark.parametrize("flag", sorted(OFF))
def test_parity_fails_with_the_feature_forced_on(upstream_oracle, flag):
    assert_parity_can_fail(upstream_oracle, [MOE_MTP_EXPERT_BIAS], {flag: True})
