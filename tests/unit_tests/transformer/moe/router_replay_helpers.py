"""Shared helpers for the routing-replay tests: a tiny GPT + MoE (+ MTP) model on CPU."""

import torch

from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.router_replay import RouterReplay
from tests.unit_tests.test_utilities import unit_device
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import (
    BATCH,
    SEQ,
    build_gpt,
    causal_batch,
    tiny_moe_mtp_config,
)

NUM_TOKENS = SEQ * BATCH


def replay_config(**overrides):
    values = dict(moe_enable_routing_replay=True)
    values.update(overrides)
    return tiny_moe_mtp_config(**values)


def reset_router_replay():
    """Drop every registered instance so each test starts from an empty registry."""
    RouterReplay.clear_global_router_replay_action()
    RouterReplay.clear_global_router_replay_instances()


def decoder_routers(model):
    return [layer.mlp.router for layer in model.decoder.layers]


def mtp_routers(model):
    return [
        m
        for name, m in model.named_modules()
        if name.startswith("mtp.") and isinstance(m, TopKRouter)
    ]


class RoutingCapture:
    """Collects the routing map each router produced, per router, in call order."""

    def __init__(self, routers):
        self.maps = {id(r): [] for r in routers}
        self.inputs = {id(r): [] for r in routers}
        self.handles = [r.register_forward_hook(self._hook) for r in routers]

    def _hook(self, module, args, output):
        self.maps[id(module)].append(output[1].detach().clone())
        self.inputs[id(module)].append(args[0].detach().clone())

    def free_choice(self, router):
        """The routing map the router's own scores give for its last input (no replay)."""
        with torch.no_grad():
            logits = router.gating(self.inputs[id(router)][-1]).view(-1, router.num_experts)
        return indices_to_map(torch.topk(logits, router.topk, dim=1).indices, router.num_experts)

    def last(self, router):
        return self.maps[id(router)][-1]

    def remove(self):
        for h in self.handles:
            h.remove()


def experts_used(routing_map):
    return set(torch.nonzero(routing_map.any(dim=0)).flatten().tolist())


def indices_to_map(indices, num_experts):
    out = torch.zeros(indices.shape[0], num_experts, dtype=torch.bool, device=indices.device)
    out.scatter_(1, indices.long(), True)
    return out


def forced_indices(experts, num_tokens=NUM_TOKENS):
    return torch.tensor([list(experts)] * num_tokens, dtype=torch.long, device=unit_device())


def run_forward(model, seed=0):
    tokens, position_ids, mask = causal_batch(seed)
    return model(tokens, position_ids, mask, labels=tokens)
