"""The CPU harness itself: two spawned gloo ranks build tensor-parallel state and reduce."""

import pytest
import torch
import torch.distributed as dist

from tests.unit_tests.test_utilities import Utils, run_distributed


def _two_rank_tensor_parallel(rank, world_size):
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    Utils.initialize_model_parallel(tensor_model_parallel_size=2)
    assert ps.get_tensor_model_parallel_world_size() == 2
    assert ps.get_tensor_model_parallel_rank() == rank
    out = reduce_from_tensor_model_parallel_region(torch.full((3,), float(rank + 1)))
    assert torch.equal(out, torch.full((3,), 3.0)), out


def _failing_rank(rank, world_size):
    if rank == 1:
        raise ValueError("rank one fails on purpose")


class TestDistributedHarness:
    @pytest.mark.slow
    def test_two_ranks_tensor_parallel_all_reduce(self):
        run_distributed(_two_rank_tensor_parallel, 2)

    @pytest.mark.slow
    def test_child_failure_reaches_the_parent(self):
        try:
            run_distributed(_failing_rank, 2)
        except AssertionError as exc:
            assert "rank one fails on purpose" in str(exc)
        else:
            raise AssertionError("a failing rank must fail the test")

    def test_world_size_one_in_process(self):
        Utils.initialize_model_parallel(1, 1)
        assert dist.get_world_size() == 1
        Utils.destroy_model_parallel()

    @pytest.mark.slow
    def test_ranks_meet_even_when_the_rendezvous_port_is_taken(self, monkeypatch):
        # Between picking MASTER_PORT and rank 0 binding it, a test run beside this one can
        # take the port; the ranks must not depend on it being free.
        import socket

        from tests.unit_tests import test_utilities

        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            monkeypatch.setattr(test_utilities, "_free_port", lambda: taken.getsockname()[1])
            run_distributed(_two_rank_tensor_parallel, 2, timeout=60)
