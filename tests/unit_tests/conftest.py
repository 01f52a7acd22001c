"""Unit-test setup shared by every test under tests/unit_tests (upstream's layout and style)."""

import pytest

from tests.unit_tests import cpu_compat
from tests.unit_tests.test_utilities import Utils

cpu_compat.install()


@pytest.fixture(scope="session", autouse=True)
def _teardown_distributed():
    yield
    Utils.destroy_model_parallel()
    Utils.destroy_process_group()
