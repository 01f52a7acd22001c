"""R3 (rollout routing replay) with an MTP policy, on the CPU.

The rollout engine routes every token to some experts; training must reuse exactly that routing,
even though the trainer's weights (and numerics) differ from the engine's. Here the "rollout" is
a forward in RECORD mode; the router weights are then perturbed, as a policy update would; the
training forward in REPLAY_FORWARD mode still routes every token as recorded. MTP layers keep
their own routing: only decoder layers replay.

    python examples/r3_record_then_replay.py
"""

import torch

from megatron.core import cpu_harness
from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction
from tiny_models import gpt, moe_config, token_batch


def routing_maps(model):
    """Capture each decoder MoE router's [tokens, experts] routing map on every forward."""
    seen = {}
    for layer in model.decoder.layers:
        router = layer.mlp.router

        def keep(module, inputs, output, number=layer.layer_number):
            seen[number] = output[1].detach().clone()

        router.register_forward_hook(keep)
    return seen


def as_map(indices, num_experts):
    return torch.zeros(indices.shape[0], num_experts, dtype=torch.bool).scatter_(1, indices, True)


def main():
    with cpu_harness.single_process(seed=1234):
        config = moe_config(moe_enable_routing_replay=True)
        policy = gpt(config)
        seen = routing_maps(policy)
        tokens, positions, mask = token_batch(seed=3)

        RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD, model=policy)
        with torch.no_grad():
            policy(tokens, positions, mask, compute_mtp=False)
        recorded = RouterReplay.get_recorded_data_by_layer(policy)   # {decoder layer: [tokens, topk]}
        print(f"recorded routing of decoder layers {sorted(recorded)}")

        with torch.no_grad():   # the trainer's weights are not the rollout engine's
            for layer in policy.decoder.layers:
                layer.mlp.router.weight.add_(0.5 * torch.randn_like(layer.mlp.router.weight))
            policy(tokens, positions, mask, compute_mtp=False)
        drifted = sum(int((seen[n] != as_map(recorded[n], config.num_moe_experts)).any(-1).sum())
                      for n in recorded)
        print(f"without replay, {drifted} token-layer routings differ from the rollout's")

        RouterReplay.set_replay_data(recorded, model=policy)
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD, model=policy)
        loss = policy(tokens, positions, mask, labels=tokens).mean()
        loss.backward()
        for number, indices in recorded.items():
            assert torch.equal(seen[number], as_map(indices, config.num_moe_experts)), number
        print(f"with replay, training used the rollout's routing in every layer; loss {loss.item():.4f}")
        RouterReplay.clear_global_router_replay_action(model=policy)
        RouterReplay.clear_global_indices(model=policy)
        assert drifted > 0, "the perturbation should have changed some routing"
    print("ok")


if __name__ == "__main__":
    main()
