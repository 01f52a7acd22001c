"""The distributed optimizer with param groups that mix fp32 and bf16 parameters.

A bf16 GPT + MoE model whose router gates are kept fp32 (``mark_keep_in_fp32``) puts fp32 and bf16
parameters in the same optimizer param group. Every model parameter's optimizer entry must be its
own (the main-param shard holds that parameter's values), a checkpoint saved and loaded into a
freshly built model must restore every state tensor bit for bit, and the optimizer must build with
its state offloaded to the CPU too. Runs on gloo ranks (``tests/unit_tests/optimizer/distopt_cpu``).
"""

import os

import pytest
import torch

from megatron.core import cpu_harness, dist_checkpointing
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.transformer.module import Float16Module, mark_keep_in_fp32
from megatron.core.transformer.moe.router import Router
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import build_gpt, tiny_moe_mtp_config
from tests.unit_tests.optimizer import distopt_cpu
from tests.unit_tests.optimizer.test_distrib_optimizer_dp_reshardable import local_optimizer_shards
from tests.unit_tests.test_utilities import Utils, run_distributed, unit_device

SHARDING = {"distrib_optim_sharding_type": "dp_reshardable"}


def build(seed, offload=False):
    distopt_cpu.install()
    if offload:  # it builds CUDA streams for its host copies: the harness's stand-ins
        cpu_harness.install_cuda_stand_ins()
    Utils.initialize_model_parallel(1, 1, seed=seed)
    config = tiny_moe_mtp_config(mtp_num_layers=None, bf16=True, moe_router_dtype="fp32")
    gpt = build_gpt(config, with_mtp=False)
    for router in (m for m in gpt.modules() if isinstance(m, Router)):
        mark_keep_in_fp32(router.weight)
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True)
    model = DistributedDataParallel(config, ddp_config, Float16Module(config, gpt.to(unit_device())))
    extra = dict(optimizer_cpu_offload=True, optimizer_offload_fraction=1.0) if offload else {}
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam", lr=1e-3, weight_decay=0.0, use_distributed_optimizer=True, bf16=True,
            **extra,
        ),
        [model],
    )
    if not offload:  # an offloaded step needs CUDA params to copy to the host
        for dist_opt in optimizer.chained_optimizers:
            dist_opt._init_optimizer_states_with_dummy_values()
    return model, optimizer


def shards(model, optimizer):
    """(name, model param, start, end, state) for every local shard, state read the way
    checkpointing reads it."""
    params = dict(model.named_parameters())
    for name, start, end, state in local_optimizer_shards(model, optimizer):
        yield name, params[name], start, end, state


def assert_each_entry_is_its_own(model, optimizer):
    mixed = [
        i
        for o in optimizer.chained_optimizers
        for i, (fp32, float16) in enumerate(zip(o.model_fp32_groups, o.model_float16_groups))
        if fp32 and float16
    ]
    assert mixed, "no param group mixes fp32 and bf16 params: the test would not test the mix"
    for name, param, start, end, state in shards(model, optimizer):
        own = param.detach().float().view(-1)[start:end].cpu()
        assert torch.equal(state["param"].detach().float().view(-1).cpu(), own), (
            f"the optimizer's main param for {name} holds another parameter's values"
        )


def _own_entries(rank, world_size, offload):
    model, optimizer = build(seed=1, offload=offload)
    assert_each_entry_is_its_own(model, optimizer)


def _step_updates_fp32_params_in_place(rank, world_size):
    model, optimizer = build(seed=1)
    fp32 = [(n, p) for n, p in model.named_parameters() if p.dtype == torch.float32]
    assert fp32 and any(p.dtype == torch.bfloat16 for p in model.parameters())
    # The fp32 shard is a view of its model parameter's storage (the param buffer), so the step
    # writes the parameter itself; no copy back follows for fp32 params.
    for name, param, start, end, state in shards(model, optimizer):
        if param.dtype == torch.float32:
            shard = state["param"]
            assert shard.untyped_storage().data_ptr() == param.untyped_storage().data_ptr(), name
    before = {n: p.detach().clone() for n, p in fp32}
    gen = torch.Generator().manual_seed(3)
    for param in model.parameters():
        param.main_grad.copy_(torch.randn(param.shape, generator=gen))
    optimizer.step()
    for name, param in fp32:
        assert not torch.equal(param.detach(), before[name]), f"the step left {name} unchanged"
    for name, param, start, end, state in shards(model, optimizer):
        own = param.detach().view(-1)[start:end]
        assert torch.equal(state["param"].detach().view(-1).to(param.dtype), own), (
            f"after the step {name} is not its own main param (rounded to {param.dtype})"
        )


def _save(rank, world_size, ckpt_dir, ref_path):
    model, optimizer = build(seed=1)
    gen = torch.Generator().manual_seed(100)
    saved = {}
    with torch.no_grad():
        for name, _, start, end, state in shards(model, optimizer):
            for key, ten in state.items():
                if key != "param":
                    ten.copy_(torch.rand(ten.shape, generator=gen) + 0.5)
                saved[(name, key, start, end)] = ten.detach().cpu().clone()
    model_sd = model.module.sharded_state_dict()
    dist_checkpointing.save(
        {"model": model_sd, "optimizer": optimizer.sharded_state_dict(model_sd, metadata=SHARDING)},
        ckpt_dir,
    )
    torch.save(saved, ref_path)


def _load_and_compare(rank, world_size, ckpt_dir, ref_path):
    model, optimizer = build(seed=2)  # other values: everything compared comes from the file
    model_sd = model.module.sharded_state_dict()
    loaded = dist_checkpointing.load(
        {
            "model": model_sd,
            "optimizer": optimizer.sharded_state_dict(
                model_sd, is_loading=True, metadata=SHARDING
            ),
        },
        ckpt_dir,
    )
    model.module.load_state_dict(loaded["model"])
    optimizer.load_state_dict(loaded["optimizer"])
    saved = torch.load(ref_path, weights_only=False)
    seen = set()
    for name, _, start, end, state in shards(model, optimizer):
        for key, ten in state.items():
            expected = saved[(name, key, start, end)]
            assert ten.dtype == expected.dtype and torch.equal(ten.detach().cpu(), expected), (
                f"optimizer state {key} of {name}[{start}:{end}] differs after the load"
            )
            seen.add((name, key, start, end))
    assert seen == set(saved)
    assert_each_entry_is_its_own(model, optimizer)


@pytest.mark.parametrize("offload", [False, True], ids=["on_device", "cpu_offload"])
def test_each_param_maps_to_its_own_optimizer_entry(offload):
    run_distributed(_own_entries, 1, offload)


@pytest.mark.slow
def test_a_step_updates_the_fp32_params_through_their_shared_shards():
    run_distributed(_step_updates_fp32_params_in_place, 1)


def test_save_and_load_restore_every_state_tensor_bit_for_bit(tmp_path):
    ckpt_dir, ref_path = str(tmp_path / "ckpt"), str(tmp_path / "ref.pt")
    os.makedirs(ckpt_dir)
    run_distributed(_save, 1, ckpt_dir, ref_path)
    run_distributed(_load_and_compare, 1, ckpt_dir, ref_path)
