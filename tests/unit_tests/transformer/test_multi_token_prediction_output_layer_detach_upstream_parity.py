"""``mtp_detach_output_layer`` off equals pristine upstream (patch mtp-detach-output-layer)."""

import pytest

from tests.unit_tests.upstream_oracle import DENSE_MTP, MOE_MTP


@pytest.mark.slow
def test_detach_off_equals_pristine_upstream(upstream_oracle):
    upstream_oracle.compare([DENSE_MTP, MOE_MTP], fork_config={"mtp_detach_output_layer": False})
