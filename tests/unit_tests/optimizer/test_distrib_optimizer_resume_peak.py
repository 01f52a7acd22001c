"""Resuming the distributed optimizer adds little on top of the optimizer state training holds.

A colocated RL job resumes a large MoE policy on GPUs that are already nearly full, so the
resume must not stage the whole (unsharded) optimizer state on the device. In 0.19.2 the
``dp_reshardable`` load fills the shard-sized state tensors in place; this test measures it on
gloo ranks. A tracker counts every storage an op creates until it is freed; the peak of those
live bytes while the checkpoint is read and loaded (``sharded_state_dict(is_loading=True)``, the
read, ``load_state_dict``) must stay under a quarter of the state the rank holds. On the CPU
harness the CPU is the device, so everything the load allocates counts. Staging the rank's state
once would need 1x, the full state of 2 data-parallel ranks 2x. The same tracker must see the
state itself being allocated, so it does see allocations of that size.
"""

import os

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from megatron.core import dist_checkpointing
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.transformer.module import Float16Module
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import build_gpt, tiny_moe_mtp_config
from tests.unit_tests.optimizer import distopt_cpu
from tests.unit_tests.test_utilities import Utils, run_distributed, unit_device

SHARDING = {"distrib_optim_sharding_type": "dp_reshardable"}
LOAD_BOUND = 0.25


class AllocationPeak(TorchDispatchMode):
    """Peak bytes of live storages created by aten ops inside the mode (views and in-place ops
    of their inputs create none)."""

    def __init__(self):
        super().__init__()
        self.live = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage()._cdata
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key in inputs:
                continue
            known = self.live.get(key)
            if known is None or known[1].expired():
                self.live[key] = (storage.nbytes(), StorageWeakRef(storage))
        current = sum(n for n, ref in self.live.values() if not ref.expired())
        self.peak = max(self.peak, current)
        return out


def build(seed):
    distopt_cpu.install()
    Utils.initialize_model_parallel(1, 1, seed=seed)
    config = tiny_moe_mtp_config(
        mtp_num_layers=None, bf16=True, hidden_size=128, ffn_hidden_size=512,
        moe_ffn_hidden_size=512,
    )
    gpt = build_gpt(config, with_mtp=False)
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True)
    model = DistributedDataParallel(config, ddp_config, Float16Module(config, gpt.to(unit_device())))
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-3, use_distributed_optimizer=True, bf16=True),
        [model],
    )
    return model, optimizer


def state_tensors(optimizer):
    for dist_opt in optimizer.chained_optimizers:
        for state in dist_opt.optimizer.state.values():
            for key, value in sorted(state.items()):
                if torch.is_tensor(value) and value.dim() > 0:
                    yield key, value


def _save(rank, world_size, ckpt_dir):
    model, optimizer = build(seed=1)
    for dist_opt in optimizer.chained_optimizers:
        dist_opt._init_optimizer_states_with_dummy_values()
    gen = torch.Generator().manual_seed(7 + rank)
    with torch.no_grad():
        for _, value in state_tensors(optimizer):
            value.copy_(torch.rand(value.shape, generator=gen) + 0.5)
    model_sd = model.module.sharded_state_dict()
    dist_checkpointing.save(
        {"model": model_sd, "optimizer": optimizer.sharded_state_dict(model_sd, metadata=SHARDING)},
        ckpt_dir,
    )
    sums = sorted(float(value.double().sum()) for _, value in state_tensors(optimizer))
    torch.save(sums, os.path.join(ckpt_dir, f"sums.{rank}.pt"))


def _resume(rank, world_size, ckpt_dir):
    model, optimizer = build(seed=2)
    assert not list(state_tensors(optimizer)), "a fresh optimizer should hold no state yet"
    # The state training holds, allocated as a resume allocates it (0.19.2's torch-Adam path
    # needs it before sharded_state_dict; TE's and Apex's Adam allocate it inside that call).
    allocating = AllocationPeak()
    with allocating:
        for dist_opt in optimizer.chained_optimizers:
            dist_opt._init_optimizer_states_with_dummy_values()
    held = sum(value.numel() * value.element_size() for _, value in state_tensors(optimizer))
    assert held > 0 and allocating.peak >= held, (
        f"rank {rank}: the tracker saw {allocating.peak} B while {held} B of state were allocated"
    )
    model_sd = model.module.sharded_state_dict()
    loading = AllocationPeak()
    with loading:
        loaded = dist_checkpointing.load(
            {"optimizer": optimizer.sharded_state_dict(model_sd, is_loading=True, metadata=SHARDING)},
            ckpt_dir,
        )
        optimizer.load_state_dict(loaded["optimizer"])
        del loaded
    assert loading.peak <= LOAD_BOUND * held, (
        f"rank {rank}: loading the checkpoint peaked at {loading.peak} B of new allocations on "
        f"top of the {held} B of optimizer state the rank holds (bound {LOAD_BOUND}x)"
    )
    after = sum(value.numel() * value.element_size() for _, value in state_tensors(optimizer))
    assert after == held, "loading replaced the state tensors instead of filling them"
    sums = sorted(float(value.double().sum()) for _, value in state_tensors(optimizer))
    assert sums == torch.load(os.path.join(ckpt_dir, f"sums.{rank}.pt")), "state differs after load"


@pytest.mark.slow
def test_resume_peaks_at_the_ranks_own_optimizer_state(tmp_path):
    ckpt_dir = str(tmp_path / "ckpt")
    os.makedirs(ckpt_dir)
    run_distributed(_save, 2, ckpt_dir)
    run_distributed(_resume, 2, ckpt_dir)
