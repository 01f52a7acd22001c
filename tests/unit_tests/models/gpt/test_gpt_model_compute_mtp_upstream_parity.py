"""``compute_mtp=None`` (the default) equals pristine upstream (patch gpt-compute-mtp)."""

import pytest

from tests.unit_tests.upstream_oracle import DENSE_MTP, MOE_MTP


@pytest.mark.slow
def test_compute_mtp_none_equals_pristine_upstream(upstream_oracle):
    upstream_oracle.compare([DENSE_MTP, MOE_MTP], fork_forward={"compute_mtp": None})
