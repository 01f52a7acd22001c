"""cpu_shm_mode off, without torch_memory_saver, the persistent async-save queue hands its worker
what pristine upstream hands it (patch async-ckpt-stage-for-persistent-worker): the trainer's own
tensors and the preload step, for the worker to run."""

SPEC = {"scenario": "persistent_async_request", "name": "persistent async request"}


def test_cpu_shm_mode_off_equals_pristine_upstream(upstream_oracle):
    upstream, fork = upstream_oracle.compare([SPEC], fork_config={"cpu_shm_mode": False})
    assert upstream[0]["outputs"]["preload_fn_kept"] is True
    assert upstream[0]["outputs"]["same_tensor"] is True
