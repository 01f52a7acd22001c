"""Async checkpoint saving through the persistent worker when tensors live in torch_memory_saver
regions (colocated RL). The worker receives each request over a multiprocessing queue, which
exports device tensors over CUDA IPC; memory-saver allocations cannot be exported, so upstream's
save waits forever. With a memory saver in use, or with ``cpu_shm_mode``, the trainer copies the
tensors to CPU shared memory before the request crosses to the worker.

CPU stand-ins: a torch_memory_saver whose regions record the storages they allocate, and a
worker boundary that pickles each request exactly as the queue's feeder thread does
(``ForkingPickler``) and refuses, like CUDA IPC, to export a memory-saver allocation. The worker
itself is upstream's ``PersistentAsyncCaller.async_loop``, run in this process on what crossed.
"""

import contextlib
import io
import logging
import queue
import sys
import types
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing import ShardedTensor
from megatron.core.dist_checkpointing.strategies import async_utils
from megatron.core.dist_checkpointing.strategies.async_utils import (
    AsyncCallsQueue,
    PersistentAsyncCaller,
)
from tests.unit_tests.test_utilities import Utils


class StandInSaver:
    """torch_memory_saver's singleton: ``region()`` records every storage allocated inside it."""

    def __init__(self, in_use=True):
        self._impl = object() if in_use else None
        self.storages = []  # (data_ptr, nbytes, tensor): the tensor keeps the pointer alive

    @contextlib.contextmanager
    def region(self, tag="default", enable_cpu_backup=False):
        originals = {name: getattr(torch, name) for name in ("randn", "zeros", "empty", "arange")}

        def recording(factory):
            def allocate(*args, **kwargs):
                tensor = factory(*args, **kwargs)
                storage = tensor.untyped_storage()
                self.storages.append((storage.data_ptr(), storage.nbytes(), tensor))
                return tensor

            return allocate

        for name, factory in originals.items():
            setattr(torch, name, recording(factory))
        try:
            yield
        finally:
            for name, factory in originals.items():
                setattr(torch, name, factory)

    def owns(self, tensor: torch.Tensor) -> bool:
        ptr = tensor.untyped_storage().data_ptr()
        return any(start <= ptr < start + max(size, 1) for start, size, _ in self.storages)


class WorkerBoundary:
    """The persistent worker's request queue. ``put`` serializes the request as the real queue
    does, refusing memory-saver memory as CUDA IPC does, then lets upstream's worker loop run it."""

    def __init__(self, saver, preload_q, comp_q):
        self.saver = saver
        self.preload_q, self.comp_q = preload_q, comp_q
        self.crossed = []  # every tensor that crossed to the worker
        self.crossed_ptrs = set()  # their storages, as they were when they crossed
        self.received = []  # the requests as the worker got them

    def put(self, item):
        boundary = self

        class Exporting(ForkingPickler):
            def reducer_override(self, obj):
                if isinstance(obj, torch.Tensor):
                    if boundary.saver is not None and boundary.saver.owns(obj):
                        raise RuntimeError(
                            "cannot export a torch_memory_saver allocation to another process"
                        )
                    boundary.crossed.append(obj)
                    boundary.crossed_ptrs.add(obj.untyped_storage().data_ptr())
                return NotImplemented

        Exporting(io.BytesIO(), 4).dump(item)
        self.received.append(item)
        work = queue.Queue()
        work.put(item)
        work.put("DONE")
        PersistentAsyncCaller.async_loop(
            0, work, self.preload_q, self.comp_q, logging.getLogger().getEffectiveLevel()
        )


@pytest.fixture
def worker(monkeypatch):
    """Routes PersistentAsyncCaller to an in-process worker behind a WorkerBoundary."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(async_utils, "_set_process_qos", lambda **kwargs: None)
    preload_q, comp_q = queue.Queue(), queue.Queue()

    def install(saver):
        boundary = WorkerBoundary(saver, preload_q, comp_q)
        monkeypatch.setattr(PersistentAsyncCaller, "_persistent_process", object())
        monkeypatch.setattr(PersistentAsyncCaller, "_persistent_queue", boundary)
        monkeypatch.setattr(PersistentAsyncCaller, "_persistent_preload_q", preload_q)
        monkeypatch.setattr(PersistentAsyncCaller, "_persistent_comp_q", comp_q)
        monkeypatch.setattr(AsyncCallsQueue, "_persistent_caller", None)
        return boundary

    yield install
    caller = AsyncCallsQueue._persistent_caller
    if caller is not None:
        caller.process = None  # the stand-in worker has no process to stop


def _install_saver(monkeypatch, saver):
    monkeypatch.setitem(
        sys.modules, "torch_memory_saver", types.SimpleNamespace(torch_memory_saver=saver)
    )


def _state_dict(saver=None):
    region = saver.region(tag="weights") if saver is not None else contextlib.nullcontext()
    torch.manual_seed(3)
    with region:
        weight = torch.randn(8, 16)
        bias = torch.arange(16, dtype=torch.float32)
    return {
        "weight": ShardedTensor.from_rank_offsets("weight", weight, replica_id=0),
        "bias": ShardedTensor.from_rank_offsets("bias", bias, replica_id=0),
    }


def _save_through_persistent_worker(state_dict, ckpt_dir, **queue_kwargs):
    calls = AsyncCallsQueue(persistent=True, **queue_kwargs)
    request = dist_checkpointing.save(
        state_dict, str(ckpt_dir), async_sharded_save=True, async_strategy="mcore"
    )
    calls.schedule_async_request(request)
    assert calls.maybe_finalize_async_calls(blocking=True) == [0]


def _load(ckpt_dir):
    template = {
        "weight": ShardedTensor.from_rank_offsets("weight", torch.empty(8, 16), replica_id=0),
        "bias": ShardedTensor.from_rank_offsets("bias", torch.empty(16), replica_id=0),
    }
    return dist_checkpointing.load(template, str(ckpt_dir))


class TestPersistentWorkerStaging:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_memory_saver_tensors_never_reach_the_worker(self, monkeypatch, worker, tmp_path):
        saver = StandInSaver(in_use=True)
        _install_saver(monkeypatch, saver)
        boundary = worker(saver)
        state_dict = _state_dict(saver)
        expected = {k: v.data.clone() for k, v in state_dict.items()}
        assert all(saver.owns(v.data) for v in state_dict.values())

        _save_through_persistent_worker(state_dict, tmp_path)

        assert boundary.crossed, "the request carried no tensors to the worker"
        assert not any(saver.owns(t) for t in boundary.crossed)
        assert all(t.is_shared() for t in boundary.crossed)
        (request,) = boundary.received
        assert request.preload_fn is None  # nothing left for the worker to stage
        loaded = _load(tmp_path)
        for key, value in expected.items():
            assert torch.equal(loaded[key], value), key

    def test_cpu_shm_mode_stages_without_a_memory_saver(self, monkeypatch, worker, tmp_path):
        monkeypatch.delitem(sys.modules, "torch_memory_saver", raising=False)
        boundary = worker(None)
        state_dict = _state_dict()
        originals = [v.data.untyped_storage().data_ptr() for v in state_dict.values()]

        _save_through_persistent_worker(state_dict, tmp_path, cpu_shm_mode=True)

        assert boundary.crossed_ptrs and not boundary.crossed_ptrs & set(originals)
        assert boundary.received[0].preload_fn is None
        loaded = _load(tmp_path)
        assert torch.equal(loaded["weight"], state_dict["weight"].data)
        assert torch.equal(loaded["bias"], state_dict["bias"].data)

    def test_off_and_no_saver_in_use_the_worker_preloads(self, monkeypatch, worker, tmp_path):
        # Upstream's path: the worker gets the request with its preload step and the trainer's
        # own tensors (a saver imported but never used has allocated nothing).
        saver = StandInSaver(in_use=False)
        _install_saver(monkeypatch, saver)
        boundary = worker(None)
        state_dict = _state_dict()
        originals = {v.data.untyped_storage().data_ptr() for v in state_dict.values()}

        _save_through_persistent_worker(state_dict, tmp_path, cpu_shm_mode=False)

        (request,) = boundary.received
        assert request.preload_fn is not None
        assert originals <= boundary.crossed_ptrs
        assert torch.equal(_load(tmp_path)["weight"], state_dict["weight"].data)


class TestStageRequest:
    """The staging step alone: what the persistent worker would get for a request."""

    def _request(self):
        from collections import namedtuple
        from functools import partial

        from megatron.core.dist_checkpointing.strategies.async_utils import AsyncRequest

        Pair = namedtuple("Pair", "item tensor")
        shared = torch.arange(8, dtype=torch.int64)  # 64 bytes
        odd = torch.randn(3, 4).t()  # 48 bytes, not contiguous
        raw = torch.arange(65, dtype=torch.uint8)  # 65 bytes
        flags = torch.tensor([True, False, True])
        pairs = [Pair("a", shared), Pair("b", odd), Pair("c", raw)]
        args = (0, [("file", "key", ([], pairs))], "results")
        kwargs = {"again": shared, "nested": {"flags": flags}}
        return AsyncRequest(print, args, [], kwargs, preload_fn=partial(list, args[1]))

    def test_every_tensor_copied_once_into_one_aligned_shared_buffer(self):
        request = self._request()
        staged = async_utils.stage_request_in_host_shm(request)

        assert staged.preload_fn is None and staged.async_fn is print
        assert staged.async_fn_args[0] == 0 and staged.async_fn_args[2] == "results"
        (pair_a, pair_b, pair_c) = staged.async_fn_args[1][0][2][1]
        assert type(pair_a).__name__ == "Pair" and pair_a.item == "a"
        originals = [pair.tensor for pair in request.async_fn_args[1][0][2][1]]
        originals.append(request.async_fn_kwargs["nested"]["flags"])
        copies = [pair_a.tensor, pair_b.tensor, pair_c.tensor]
        copies.append(staged.async_fn_kwargs["nested"]["flags"])
        for original, copy in zip(originals, copies):
            assert torch.equal(original, copy) and copy.dtype == original.dtype
            assert copy.untyped_storage().data_ptr() != original.untyped_storage().data_ptr()
        # the tensor named twice is copied once and both places get that copy
        assert staged.async_fn_kwargs["again"] is pair_a.tensor
        storages = {t.untyped_storage().data_ptr() for t in copies}
        assert len(storages) == 1 and copies[0].is_shared()
        offsets = sorted(t.storage_offset() * t.element_size() for t in copies)
        assert offsets == [0, 64, 128, 256]  # 64, 48, 65 and 3 bytes, each from a 64-byte boundary

    def test_memory_saver_in_use(self, monkeypatch):
        monkeypatch.delitem(sys.modules, "torch_memory_saver", raising=False)
        assert not async_utils._memory_saver_in_use()
        _install_saver(monkeypatch, StandInSaver(in_use=False))
        assert not async_utils._memory_saver_in_use()
        _install_saver(monkeypatch, StandInSaver(in_use=True))
        assert async_utils._memory_saver_in_use()
        _install_saver(monkeypatch, object())  # state it cannot read: treated as in use
        assert async_utils._memory_saver_in_use()
        monkeypatch.setitem(sys.modules, "torch_memory_saver", types.SimpleNamespace())
        assert not async_utils._memory_saver_in_use()

    def test_only_persistent_queues_stage(self, monkeypatch):
        _install_saver(monkeypatch, StandInSaver(in_use=True))
        handed = []

        class RecordingCaller:
            def schedule_async_call(self, request):
                handed.append(request)

        for persistent in (False, True):
            calls = AsyncCallsQueue(persistent=persistent, cpu_shm_mode=True)
            calls._get_async_caller = RecordingCaller
            request = self._request()
            calls.schedule_async_request(request)
            assert (handed[-1].preload_fn is None) == persistent
