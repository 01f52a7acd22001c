"""INT4 fake QAT off equals pristine upstream (patch moe-int4-fake-qat)."""

import pytest

from tests.unit_tests.upstream_oracle import MOE_MTP


@pytest.mark.slow
def test_qat_off_equals_pristine_upstream(upstream_oracle):
    upstream_oracle.compare([MOE_MTP], fork_config={"moe_int4_fake_qat": False})
