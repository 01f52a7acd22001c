"""Hyper-connections off equals pristine upstream (patch mhc-hyper-connections)."""

import pytest

from tests.unit_tests.upstream_oracle import DENSE_MTP, MOE_MTP


@pytest.mark.slow
def test_hyper_connections_off_equal_pristine_upstream(upstream_oracle):
    upstream_oracle.compare([DENSE_MTP, MOE_MTP], fork_config={"enable_mhc_connections": False})
