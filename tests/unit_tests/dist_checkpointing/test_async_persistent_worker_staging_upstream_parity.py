"""cpu_shm_mode off, without torch_memory_saver, the persistent async-save queue hands its worker
what pristine upstream hands it (patch async-ckpt-stage-for-persistent-worker): the trainer's own
tensors and the preload step, for the worker to run. With cpu_shm_mode forced on the parity check
must fail."""

import pytest

from tests.unit_tests.upstream_oracle import assert_parity_can_fail

SPEC = {"scenario": "persistent_async_request", "name": "persistent async request"}


@pytest.mark.slow
def test_cpu_shm_mode_off_equals_pristine_upstream(upstream_oracle):
    upstream, fork = upstream_oracle.compare([SPEC], fork_config={"cpu_shm_mode": False})
    assert upstream[0]["outputs"]["preload_fn_kept"] is True
    assert upstream[0]["outputs"]["same_tensor"] is True


@pytest.mark.slow
def test_parity_fails_with_the_feature_forced_on(upstream_oracle):
    assert_parity_can_fail(upstream_oracle, [SPEC], {"cpu_shm_mode": True})
