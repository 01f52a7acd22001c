"""Routing replay with expert parallelism and sequence parallelism on two GPUs.

With sequence parallelism each tensor-parallel rank routes its own sequence shard, and the
alltoall dispatcher exchanges tokens across the expert-parallel group. Replay data recorded per
rank must come back on the same local tokens: replayed routing equals the recorded routing token
by token, even after the router weights change, and replaying the recording on the original
weights reproduces the recorded forward exactly.
"""

import copy

import pytest
import torch

from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction
from tests.unit_tests.test_utilities import Utils, run_distributed, unit_device
from tests.unit_tests.transformer.moe.router_replay_helpers import (
    BATCH,
    SEQ,
    RoutingCapture,
    build_gpt,
    causal_batch,
    decoder_routers,
    indices_to_map,
    mtp_routers,
    replay_config,
    reset_router_replay,
)

TP = EP = 2


def _forward(model, device):
    tokens, position_ids, mask = (t.to(device) for t in causal_batch(seed=11))
    with torch.no_grad():
        return model(tokens, position_ids, mask)


def _allow_torch_norm_under_sequence_parallel():
    """The CPU-friendly local spec uses torch LayerNorm, whose wrapper refuses sequence parallelism
    because it does not tag its weights for the sequence-parallel gradient all-reduce. This test
    only runs forwards, so in this (spawned) process build the norm from a copy of the config with
    sequence parallelism off and tag the weights ourselves."""
    from megatron.core.transformer import torch_norm

    original = torch_norm.WrappedTorchNorm.__new__

    def build(cls, config, hidden_size, eps=1e-5, **kwargs):
        plain = copy.copy(config)
        plain.sequence_parallel = False
        norm = original(cls, plain, hidden_size, eps, **kwargs)
        for param in norm.parameters():
            param.sequence_parallel = True
        return norm

    torch_norm.WrappedTorchNorm.__new__ = staticmethod(build)


def _replay_matches_recorded_with_ep_and_sp(rank, world_size, dispatcher):
    _allow_torch_norm_under_sequence_parallel()
    Utils.initialize_model_parallel(
        tensor_model_parallel_size=TP,
        expert_model_parallel_size=EP,
        expert_tensor_parallel_size=1,
    )
    reset_router_replay()
    device = unit_device()
    config = replay_config(
        tensor_model_parallel_size=TP,
        expert_model_parallel_size=EP,
        expert_tensor_parallel_size=1,
        sequence_parallel=True,
        moe_token_dispatcher_type=dispatcher,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    model = build_gpt(config, with_mtp=True).to(device)
    model.eval()
    routers = decoder_routers(model)
    assert RouterReplay.get_instances(model) == [r.router_replay for r in routers]
    assert all(r.router_replay is None for r in mtp_routers(model))
    capture = RoutingCapture(routers)
    local_tokens = SEQ // TP * BATCH

    RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)
    recorded_logits = _forward(model, device)
    recorded = {k: v.clone() for k, v in RouterReplay.get_recorded_data_by_layer(model).items()}
    assert sorted(recorded) == [1, 2]
    for number, router in zip([1, 2], routers):
        # The router saw this rank's sequence shard only.
        assert recorded[number].shape == (local_tokens, config.moe_router_topk)
        assert torch.equal(capture.last(router), indices_to_map(recorded[number], 4))

    # Change every decoder router: free routing now differs from the recording ...
    original = [r.weight.detach().clone() for r in routers]
    gen = torch.Generator(device="cpu").manual_seed(2024)  # same on both TP ranks
    for router in routers:
        router.weight.data.copy_(torch.randn(router.weight.shape, generator=gen).to(device))
    RouterReplay.clear_global_router_replay_action()
    _forward(model, device)
    assert any(
        not torch.equal(capture.last(r), indices_to_map(recorded[n], 4))
        for n, r in zip([1, 2], routers)
    ), "new router weights should change the free routing"

    # ... but replay forces the recorded experts on every local token.
    RouterReplay.clear_global_indices()
    RouterReplay.set_replay_data(recorded)
    RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
    _forward(model, device)
    for number, router in zip([1, 2], routers):
        assert torch.equal(capture.last(router), indices_to_map(recorded[number], 4)), number

    # On the original weights, replaying the recording reproduces the recorded forward.
    for router, weight in zip(routers, original):
        router.weight.data.copy_(weight)
    replayed_logits = _forward(model, device)
    # Not bitwise: the expert-output combine accumulates with atomics on GPU.
    torch.testing.assert_close(replayed_logits, recorded_logits, rtol=1e-5, atol=1e-5)
    capture.remove()
    reset_router_replay()


@pytest.mark.gpu
@pytest.mark.multi_gpu(2)
class TestRouterReplayExpertAndSequenceParallel:
    def test_replayed_routing_matches_recorded_token_by_token(self):
        # NCCL on two GPUs (run_distributed picks NCCL when CUDA is present), alltoall dispatcher.
        # The worker also runs on two gloo ranks with the allgather dispatcher (CUDA streams are
        # needed by alltoall), which is how it was checked without GPUs.
        run_distributed(_replay_matches_recorded_with_ep_and_sp, 2, "alltoall")

