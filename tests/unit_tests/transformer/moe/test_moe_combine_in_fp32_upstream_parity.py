"""moe_combine_in_fp32 off equals pristine upstream (patch moe-combine-in-fp32).

Checked where the flag would change the numbers: a bf16 model, SequentialMLP and grouped experts,
allgather and alltoall dispatchers. The same scenarios with the flag on must differ from upstream,
so the parity check is able to fail.
"""

import pytest

from tests.unit_tests.upstream_oracle import MOE_MTP, assert_parity_can_fail, moe_bf16_specs

WHERE_IT_MATTERS = moe_bf16_specs()


@pytest.mark.slow
def test_combine_in_fp32_off_equals_pristine_upstream(upstream_oracle):
    upstream_oracle.compare([MOE_MTP, *WHERE_IT_MATTERS], fork_config={"moe_combine_in_fp32": False})


@pytest.mark.slow
def test_parity_fails_with_the_feature_forced_on(upstream_oracle):
    assert_parity_can_fail(upstream_oracle, WHERE_IT_MATTERS, {"moe_combine_in_fp32": True})
