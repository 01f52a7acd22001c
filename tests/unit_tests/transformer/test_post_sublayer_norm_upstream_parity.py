"""Post-sublayer norms off equals pristine upstream (patch post-sublayer-layernorm)."""

import pytest

from tests.unit_tests.upstream_oracle import DENSE_MTP, MOE_MTP


@pytest.mark.slow
def test_norms_off_equal_pristine_upstream(upstream_oracle):
    upstream_oracle.compare(
        [DENSE_MTP, MOE_MTP],
        fork_config={"post_self_attn_layernorm": False, "post_mlp_layernorm": False},
    )
