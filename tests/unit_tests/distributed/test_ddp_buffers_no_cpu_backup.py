"""disable_grad_buffers_cpu_backup / disable_param_buffers_cpu_backup: DDP's gradient buffers and
the distributed optimizer's parameter buffers are allocated inside torch_memory_saver regions
without CPU backup, so a colocated RL run that pauses training memory for rollout frees them
instead of copying them to the host. A stand-in saver records which tensors each region
allocated (torch_memory_saver needs CUDA)."""

import contextlib
import logging
import sys
import types

import pytest
import torch

from megatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    param_and_grad_buffer,
)
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import build_gpt, tiny_moe_mtp_config
from tests.unit_tests.test_utilities import Utils


class StandInSaver:
    """torch_memory_saver's region API; records (tag, enable_cpu_backup, tensor) per allocation."""

    def __init__(self):
        self._impl = object()  # a saver already in use: its hook mode is decided
        self.allocations = []

    @contextlib.contextmanager
    def region(self, tag, enable_cpu_backup=True):
        zeros = torch.zeros

        def recording_zeros(*args, **kwargs):
            tensor = zeros(*args, **kwargs)
            self.allocations.append((tag, enable_cpu_backup, tensor))
            return tensor

        torch.zeros = recording_zeros
        try:
            yield
        finally:
            torch.zeros = zeros


@pytest.fixture
def saver(monkeypatch):
    stand_in = StandInSaver()
    monkeypatch.setitem(
        sys.modules, "torch_memory_saver", types.SimpleNamespace(torch_memory_saver=stand_in)
    )
    return stand_in


def _ddp(model_fields=None, **ddp_fields):
    config = tiny_moe_mtp_config(mtp_num_layers=None, **(model_fields or {}))
    torch.manual_seed(1)
    model = build_gpt(config, with_mtp=False)
    return DistributedDataParallel(config, DistributedDataParallelConfig(**ddp_fields), model)


def _buffers(ddp):
    return list(ddp.buffers) + list(ddp.expert_parallel_buffers)


def _region_of(saver, tensor):
    return [(tag, backup) for tag, backup, t in saver.allocations if t is tensor]


class TestBuffersWithoutCpuBackup:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_grad_buffers_in_a_region_without_backup(self, saver):
        ddp = _ddp(disable_grad_buffers_cpu_backup=True)
        assert _buffers(ddp)
        for buffer in _buffers(ddp):
            assert _region_of(saver, buffer.grad_data) == [("grad_buffer", False)]
        assert {tag for tag, _, _ in saver.allocations} == {"grad_buffer"}

    def test_param_buffers_too_with_the_distributed_optimizer(self, saver):
        ddp = _ddp(
            use_distributed_optimizer=True,
            disable_grad_buffers_cpu_backup=True,
            disable_param_buffers_cpu_backup=True,
        )
        for buffer in _buffers(ddp):
            assert _region_of(saver, buffer.grad_data) == [("grad_buffer", False)]
            assert _region_of(saver, buffer.param_data) == [("param_buffer", False)]
            # Allocated as before, only elsewhere: plain buffers, not tensors autograd tracks.
            assert not buffer.param_data.requires_grad and not buffer.grad_data.requires_grad

    def test_param_flag_alone_leaves_grad_buffers_out(self, saver):
        ddp = _ddp(use_distributed_optimizer=True, disable_param_buffers_cpu_backup=True)
        for buffer in _buffers(ddp):
            assert _region_of(saver, buffer.grad_data) == []
            assert _region_of(saver, buffer.param_data) == [("param_buffer", False)]

    def test_off_by_default(self, saver):
        config = DistributedDataParallelConfig(use_distributed_optimizer=True)
        assert not config.disable_grad_buffers_cpu_backup
        assert not config.disable_param_buffers_cpu_backup
        _ddp(use_distributed_optimizer=True)
        assert saver.allocations == []

    def test_without_the_package_it_warns_and_allocates(self, monkeypatch, caplog):
        monkeypatch.setitem(sys.modules, "torch_memory_saver", None)  # import fails
        with caplog.at_level(logging.WARNING):
            ddp = _ddp(disable_grad_buffers_cpu_backup=True)
        assert all(b.grad_data is not None for b in _buffers(ddp))
        assert "torch_memory_saver is not installed" in caplog.text

    @pytest.mark.parametrize(
        "flag", ["disable_grad_buffers_cpu_backup", "disable_param_buffers_cpu_backup"]
    )
    def test_refused_with_nccl_ub(self, saver, flag):
        with pytest.raises(ValueError, match=r"cpu_backup.*nccl_ub allocates them from NCCL"):
            _ddp(use_distributed_optimizer=True, nccl_ub=True, **{flag: True})


@pytest.fixture
def mxfp8_params(monkeypatch):
    """Every parameter reads as MXFP8 to the buffer (TE's MXFP8 tensors need a GPU): the buffer
    takes its branch where params and grads share one allocation. A bf16 model, so params and
    grads share the dtype as that branch expects."""
    monkeypatch.setattr(param_and_grad_buffer, "is_mxfp8tensor", lambda tensor: True)
    return dict(bf16=True, params_dtype=torch.bfloat16)


class TestMxfp8SharedBuffer:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_shared_buffer_in_one_region_without_backup(self, saver, mxfp8_params):
        ddp = _ddp(
            mxfp8_params,
            use_distributed_optimizer=True,
            disable_grad_buffers_cpu_backup=True,
            disable_param_buffers_cpu_backup=True,
        )
        assert _buffers(ddp)
        for buffer in _buffers(ddp):
            assert buffer.grad_data is buffer.shared_buffer
            assert _region_of(saver, buffer.shared_buffer) == [("shared_param_grad_buffer", False)]
        assert {tag for tag, _, _ in saver.allocations} == {"shared_param_grad_buffer"}

    def test_shared_buffer_allocated_normally_when_off(self, saver, mxfp8_params):
        ddp = _ddp(mxfp8_params, use_distributed_optimizer=True)
        assert all(b.grad_data is b.shared_buffer for b in _buffers(ddp))
        assert saver.allocations == []

    @pytest.mark.parametrize(
        "flag", ["disable_grad_buffers_cpu_backup", "disable_param_buffers_cpu_backup"]
    )
    def test_one_flag_alone_is_refused(self, saver, mxfp8_params, flag):
        with pytest.raises(ValueError, match="MXFP8 params share one buffer.*must be equal"):
            _ddp(mxfp8_params, use_distributed_optimizer=True, **{flag: True})
