"""Full recompute with reclaim off equals pristine upstream (patch recompute-reclaim-declared-inputs)."""

import pytest

from tests.unit_tests.upstream_oracle import MOE, MTP, gpt_spec

FULL_RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}


@pytest.mark.slow
def test_reclaim_off_equals_pristine_upstream(upstream_oracle):
    upstream_oracle.compare(
        [gpt_spec("dense+MTP, full recompute", **MTP, **FULL_RECOMPUTE),
         gpt_spec("MoE+MTP, full recompute", **MOE, **MTP, **FULL_RECOMPUTE)],
        fork_config={"recompute_reclaim_inputs": False},
    )
