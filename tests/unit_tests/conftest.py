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


@pytest.fixture(scope="session")
def upstream_oracle(tmp_path_factory):
    """The pristine pinned base, extracted once per session, as an ``upstream_oracle.Oracle``."""
    from tests.unit_tests.upstream_oracle import Oracle, extract_pristine

    return Oracle(extract_pristine(tmp_path_factory.mktemp("pristine-upstream")))
