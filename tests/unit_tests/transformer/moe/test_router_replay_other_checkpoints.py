"""Routing replay recompute through nested checkpoints and through checkpoints other than
Megatron's CheckpointFunction (Transformer Engine's, used for recompute under FP8/FP4).

The recompute of a checkpoint must route as that checkpoint's forward did, even when the replay
data has moved on to a later micro-batch by backward time. Two ways that went wrong: a nested
checkpoint kept the routing only in the innermost scope while the outer recompute looked for it
in its own, and TE's checkpoint never carried the kept routing, so its recompute replayed the
latest micro-batch's data.
"""

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint

from megatron.core import tensor_parallel
from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction
from tests.unit_tests.test_utilities import Utils, unit_device
from tests.unit_tests.transformer.moe.router_replay_helpers import indices_to_map, reset_router_replay

TOKENS, EXPERTS, TOPK, HIDDEN = 8, 4, 2, 6


def _free_topk(scores, topk, num_groups=None, group_topk=None):
    return torch.topk(scores, topk, dim=1)


class TinyRouter(torch.nn.Module):
    """Scores tokens with a linear gate and routes them through one RouterReplay instance."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.replay = RouterReplay(owner=self)
        self.replay.layer_number = 1
        self.calls = []  # (grad enabled, top-k indices), in call order

    def forward(self, x):
        scores = torch.softmax(self.gate(x), dim=-1)
        probs, indices = self.replay.get_replay_topk(scores, TOPK, default_compute_topk=_free_topk)
        self.calls.append((torch.is_grad_enabled(), indices.detach().clone()))
        return x * probs.sum(dim=-1, keepdim=True)


def _data(seed):
    """Replay indices drawn on the CPU (the same everywhere), on :func:`unit_device`."""
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(TOKENS, EXPERTS, generator=gen).argsort(dim=1)[:, :TOPK].to(unit_device())


class TestRecomputeThroughOtherCheckpoints:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        reset_router_replay()
        torch.manual_seed(3)

    def teardown_method(self, method):
        reset_router_replay()
        Utils.destroy_model_parallel()

    def _two_microbatches(self, router, checkpointed):
        """Forward micro-batch 0 with data A, micro-batch 1 with data B, then both backwards."""
        a, b = _data(1), _data(2)
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        losses = []
        for data in (a, b):
            router.replay.set_target_indices(data)
            x = torch.randn(TOKENS, HIDDEN).to(unit_device()).requires_grad_()
            losses.append(checkpointed(x).sum())
        for loss in losses:
            loss.backward()
        return a, b

    def _assert_routed(self, router, expected):
        """Every routing call, forwards and recomputes in call order, used the expected data."""
        got = [indices for _, indices in router.calls]
        assert len(got) == len(expected), f"{len(got)} routing calls, expected {len(expected)}"
        for i, (indices, want) in enumerate(zip(got, expected)):
            assert torch.equal(
                indices_to_map(indices, EXPERTS), indices_to_map(want, EXPERTS)
            ), f"routing call {i} used another micro-batch's routing"

    def test_nested_checkpoints_each_recompute_their_own_routing(self):
        router = TinyRouter().to(unit_device())

        def inner(x):
            return router(x)

        def outer(x):
            return tensor_parallel.checkpoint(inner, False, x * 2.0) + 1.0

        a, b = self._two_microbatches(router, lambda x: tensor_parallel.checkpoint(outer, False, x))
        # The two forwards, then each micro-batch's backward: the outer recompute runs the inner
        # checkpoint's forward again, then the inner region is recomputed; both must replay that
        # micro-batch's routing although the replay data now holds micro-batch 1's.
        self._assert_routed(router, [a, b, a, a, b, b])

    @pytest.mark.parametrize("use_reentrant", [True, False])
    def test_foreign_checkpoint_carries_the_routing(self, use_reentrant):
        from megatron.core.tensor_parallel.random import carry_checkpoint_companions

        router = TinyRouter().to(unit_device())

        def run(x):
            return torch_checkpoint.checkpoint(
                carry_checkpoint_companions(router), x, use_reentrant=use_reentrant
            )

        a, b = self._two_microbatches(router, run)
        self._assert_routed(router, [a, b, a, b])

    def test_without_replay_instances_the_function_is_not_wrapped(self):
        from megatron.core.tensor_parallel import random as tp_random

        saved = list(tp_random._checkpoint_companions)
        tp_random._checkpoint_companions.clear()
        try:
            fn = lambda x: x  # noqa: E731
            assert tp_random.carry_checkpoint_companions(fn) is fn
        finally:
            tp_random._checkpoint_companions[:] = saved


def _fp8_ready():
    if not torch.cuda.is_available():
        return "needs CUDA"
    try:
        import transformer_engine.pytorch as te  # noqa: F401
        from transformer_engine.pytorch.fp8 import check_fp8_support
    except ImportError:
        return "needs Transformer Engine"
    ok, why = check_fp8_support()
    return None if ok else f"no FP8 on this GPU: {why}"


@pytest.mark.gpu
class TestRecomputeUnderFP8WithTransformerEngine:
    """TE specs, an FP8 recipe, and recompute through te_checkpoint (full, or selective 'moe')."""

    def setup_method(self, method):
        why = _fp8_ready()
        if why:
            pytest.skip(why)
        Utils.initialize_model_parallel(1, 1)
        reset_router_replay()
        torch.manual_seed(11)
        tensor_parallel.model_parallel_cuda_manual_seed(11)

    def teardown_method(self, method):
        reset_router_replay()
        Utils.destroy_model_parallel()

    def _model(self, recompute, fp8_recipe):
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
        from megatron.core.transformer import TransformerConfig

        values = dict(
            num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=4,
            moe_router_topk=TOPK, moe_token_dispatcher_type="alltoall", moe_grouped_gemm=True,
            add_bias_linear=False, bf16=True, params_dtype=torch.bfloat16,
            hidden_dropout=0.0, attention_dropout=0.0, moe_enable_routing_replay=True,
            fp8="hybrid", fp8_recipe=fp8_recipe,
        )  # fmt: skip
        if recompute == "full":
            values.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
        else:
            values.update(recompute_granularity="selective", recompute_modules=["moe"])
        config = TransformerConfig(**values)
        spec = get_gpt_layer_with_transformer_engine_spec(num_experts=4, moe_grouped_gemm=True)
        # Plain GPTModel (no Float16Module): cast every parameter, embeddings included.
        return GPTModel(config, spec, vocab_size=128, max_sequence_length=32).cuda().bfloat16()

    @pytest.mark.parametrize("fp8_recipe", ["delayed", "tensorwise"])
    @pytest.mark.parametrize("recompute", ["full", "moe"])
    def test_recompute_replays_its_own_microbatch(self, recompute, fp8_recipe):
        model = self._model(recompute, fp8_recipe)
        routers = [layer.mlp.router for layer in model.decoder.layers]
        seen = {id(r): [] for r in routers}
        for r in routers:
            r.register_forward_hook(
                lambda m, args, out: seen[id(m)].append((torch.is_grad_enabled(), out[1].detach().clone()))
            )
        seq, batch = 32, 2
        tokens_n = seq * batch
        # Balanced in blocks of 16 tokens per expert (FP8 GEMMs want multiples of 16):
        # micro-batch 0 sends the first half to experts 0,1 and the second to 2,3; micro-batch 1
        # the other way round. Token counts match, so a wrong replay raises no error.
        half = tokens_n // 2
        first = torch.tensor([[0, 1]] * half + [[2, 3]] * half, device="cuda")
        second = torch.tensor([[2, 3]] * half + [[0, 1]] * half, device="cuda")
        replay = [{1: first, 2: second}, {1: second, 2: first}]
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        position_ids = torch.arange(seq, device="cuda").unsqueeze(0).expand(batch, seq)
        mask = torch.triu(torch.ones(seq, seq, device="cuda"), 1).bool()[None, None]
        losses = []
        for m, data in enumerate(replay):
            RouterReplay.set_replay_data(data, model=model)
            tokens = torch.randint(0, 128, (batch, seq), device="cuda", generator=torch.Generator("cuda").manual_seed(m))
            losses.append(model(tokens, position_ids, mask, labels=tokens).float().mean())
        for loss in losses:
            loss.backward()
        for number, router in enumerate(routers, start=1):
            recomputed = [routing for grad, routing in seen[id(router)] if grad]
            assert len(recomputed) == 2, f"layer {number}: {len(recomputed)} recomputes"
            for m, routing in enumerate(recomputed):
                want = indices_to_map(replay[m][number], 4)
                assert torch.equal(routing, want), (
                    f"layer {number}, {recompute} recompute under FP8 ({fp8_recipe}) of micro-batch "
                    f"{m}: {int((routing != want).any(dim=1).sum())} of {tokens_n} tokens routed "
                    "with another micro-batch's replay data"
                )
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g.float()).all() for g in grads)
