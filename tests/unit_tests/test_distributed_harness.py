"""The CPU harness itself: two spawned gloo ranks build tensor-parallel state and reduce."""

import os

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


def _rank_sees_a_cpu_only_machine(rank, world_size):
    import importlib

    assert os.environ.get("CUDA_VISIBLE_DEVICES") == "", os.environ.get("CUDA_VISIBLE_DEVICES")
    assert not torch.cuda.is_available()
    for name in ("transformer_engine", "apex"):
        with pytest.raises(ImportError):
            importlib.import_module(name)
    from megatron.core.transformer.moe import moe_utils

    # The router's GEMM is the one that handed TE CPU pointers on a CUDA host (an illegal access).
    assert moe_utils.te_general_gemm is None
    _two_rank_tensor_parallel(rank, world_size)


class TestMoreRanksThanGPUs:
    """With more ranks than GPUs, every rank runs as on a CPU-only machine (NCCL refuses two ranks
    on one device, and TE's kernels refuse CPU tensors); forced here on any machine."""

    @pytest.mark.slow
    def test_ranks_run_without_cuda_and_without_cuda_only_libraries(self, monkeypatch, tmp_path):
        from tests.unit_tests import test_utilities

        # Importable stand-ins, so that the ranks must turn the libraries away even on a machine
        # that lacks them (spawned ranks start with the parent's sys.path).
        for name in ("transformer_engine", "apex"):
            (tmp_path / name).mkdir()
            (tmp_path / name / "__init__.py").write_text("")
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setattr(test_utilities, "_ranks_need_cpu", lambda world_size: True)
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        run_distributed(_rank_sees_a_cpu_only_machine, 2, timeout=120)
        assert os.environ.get("CUDA_VISIBLE_DEVICES") == before, "the parent's environment must be restored"

    def test_the_policy_follows_the_device_count(self, monkeypatch):
        from tests.unit_tests import test_utilities

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        assert test_utilities._ranks_need_cpu(2)
        assert not test_utilities._ranks_need_cpu(1)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        assert not test_utilities._ranks_need_cpu(2)


def test_probe_runs_as_on_a_cpu_only_machine():
    """The target of TestRerunAsOnACpuOnlyMachine; outside such a rerun it has nothing to check."""
    import importlib

    if os.environ.get("CUDA_VISIBLE_DEVICES") != "":
        pytest.skip("only meaningful inside rerun_as_on_a_cpu_only_machine")
    assert not torch.cuda.is_available()
    for name in ("transformer_engine", "apex"):
        with pytest.raises(ImportError):
            importlib.import_module(name)


class TestRerunAsOnACpuOnlyMachine:
    def test_the_rerun_has_no_gpu_and_no_cuda_only_libraries(self, monkeypatch, tmp_path):
        from tests.unit_tests.test_utilities import rerun_as_on_a_cpu_only_machine

        for name in ("transformer_engine", "apex"):  # importable unless the rerun turns them away
            (tmp_path / name).mkdir()
            (tmp_path / name / "__init__.py").write_text("")
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
        rerun_as_on_a_cpu_only_machine(f"{__file__}::test_probe_runs_as_on_a_cpu_only_machine")

    def test_a_failing_rerun_raises_with_its_output(self):
        from tests.unit_tests.test_utilities import rerun_as_on_a_cpu_only_machine

        with pytest.raises(AssertionError, match="failed as on a CPU-only machine"):
            rerun_as_on_a_cpu_only_machine(f"{__file__}::no_such_test")
