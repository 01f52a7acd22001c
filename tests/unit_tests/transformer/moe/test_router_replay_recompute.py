"""Routing replay under full activation recompute, driven by the real pipeline schedules.

R3 training sets each micro-batch's replay data in its forward step and keeps one action
(REPLAY_FORWARD) for the whole step. The 1F1B and interleaved schedules run a micro-batch's
backward (and so the recompute of its checkpointed layers) after later micro-batches have
already set their own data, and forward-only passes (old log-probs, a reference model) run
between training steps. Whatever the order, every recompute must route exactly as its own
forward did: the replay data of that micro-batch, token by token.

The workers run on two spawned gloo ranks on CPU; the GPU-marked classes run the same workers
with NCCL on two GPUs (pipeline parallel, and expert parallel with the alltoall dispatcher).
"""

import pytest
import torch

from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.pipeline_parallel import schedules
from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction
from tests.unit_tests.test_utilities import Utils, run_distributed, unit_device
from tests.unit_tests.transformer.moe.router_replay_helpers import (
    BATCH,
    SEQ,
    causal_batch,
    indices_to_map,
    replay_config,
    reset_router_replay,
)

NUM_EXPERTS, TOPK, NUM_MICROBATCHES = 4, 2, 4
TOKENS = SEQ * BATCH


class ScheduleProbe:
    """Runs a schedule and records every routing decision with the micro-batch it served.

    A forward of micro-batch m is tagged with m (the forward step sets it); a recompute runs
    inside backward with grad enabled and is matched to its micro-batch by its router input,
    which the recompute reproduces (same weights, inputs and RNG state; bit for bit on CPU).
    """

    def __init__(self, chunks):
        self.chunks = chunks
        self.routers = [
            m for chunk in chunks for m in chunk.modules() if getattr(m, "router_replay", None)
        ]
        self.microbatch = None
        self.calls = []  # (router, microbatch or None, grad enabled, input, routing map)
        for router in self.routers:
            router.register_forward_hook(self._hook)

    def _hook(self, router, args, output):
        self.calls.append(
            (
                router,
                self.microbatch,
                torch.is_grad_enabled(),
                args[0].detach().clone(),
                output[1].detach().clone(),
            )
        )

    def run(self, schedule, replay, forward_only=False):
        """One pass of ``schedule`` over NUM_MICROBATCHES, replaying ``replay[m][layer]``."""
        self.calls = []
        batches = [causal_batch(seed=100 + m) + (m,) for m in range(NUM_MICROBATCHES)]
        iterators = [iter(batches) for _ in self.chunks]

        def forward_step(data_iterator, chunk):
            tokens, position_ids, mask, m = next(data_iterator)
            device = unit_device()
            self.microbatch = m
            layers = RouterReplay.get_replay_layer_numbers(chunk)
            RouterReplay.set_replay_data({n: replay[m][n] for n in layers}, model=chunk)
            tokens, position_ids, mask = (t.to(device) for t in (tokens, position_ids, mask))
            out = chunk(tokens, position_ids, mask, labels=tokens)
            self.microbatch = None

            def loss_func(output):
                loss = output.float().mean()
                return loss, {"loss": loss.detach()}

            return out, loss_func

        model = self.chunks if len(self.chunks) > 1 else self.chunks[0]
        schedule(
            forward_step_func=forward_step,
            data_iterator=iterators if len(self.chunks) > 1 else iterators[0],
            model=model,
            num_microbatches=NUM_MICROBATCHES,
            seq_length=SEQ,
            micro_batch_size=BATCH,
            forward_only=forward_only,
        )

    def check(self, replay, expect_recompute):
        """Every forward and every recompute routed as its micro-batch's replay data."""
        forwards = {}
        recomputed = []
        for router, m, grad, inputs, routing in self.calls:
            number = router.router_replay.layer_number
            if m is not None:
                assert not grad, "the checkpointed forward runs without grad"
                assert torch.equal(routing, indices_to_map(replay[m][number], NUM_EXPERTS)), (
                    f"forward of micro-batch {m}, layer {number}"
                )
                forwards.setdefault(id(router), []).append((m, inputs))
                continue
            assert grad, "only recomputes route outside a forward step"
            owners = [
                mb
                for mb, seen in forwards.get(id(router), [])
                if torch.allclose(seen, inputs, rtol=0, atol=1e-5)
            ]
            assert len(owners) == 1, f"recompute of layer {number} matches forwards {owners}"
            got = routing
            want = indices_to_map(replay[owners[0]][number], NUM_EXPERTS)
            assert torch.equal(got, want), (
                f"recompute of micro-batch {owners[0]}, layer {number}: "
                f"{int((got != want).any(dim=1).sum())} of {got.shape[0]} tokens routed "
                "differently from that micro-batch's replay data"
            )
            recomputed.append((id(router), owners[0]))
        expected = sorted((id(r), m) for r in self.routers for m in range(NUM_MICROBATCHES))
        assert sorted((k, m) for k, seen in forwards.items() for m, _ in seen) == expected
        assert sorted(recomputed) == (expected if expect_recompute else [])


def _forwards_then_backwards(
    *, forward_step_func, data_iterator, model, num_microbatches, forward_only=False, **_
):
    """All forwards, then all backwards in order: how an RL loop without a pipeline schedule
    accumulates gradients over micro-batches (the 1F1B warm-up has the same shape)."""
    losses = []
    for _ in range(num_microbatches):
        output, loss_func = forward_step_func(data_iterator, model)
        losses.append(loss_func(output)[0])
    if not forward_only:
        for loss in losses:
            loss.backward()


def _replay_data(seed, layer_numbers, tokens=TOKENS):
    """Random distinct experts per token, per micro-batch and layer (not what the router picks)."""
    gen = torch.Generator().manual_seed(seed)
    device = unit_device()
    return [
        {
            n: torch.rand(tokens, NUM_EXPERTS, generator=gen).argsort(dim=1)[:, :TOPK].to(device)
            for n in layer_numbers
        }
        for _ in range(NUM_MICROBATCHES)
    ]


def _chunks(pp, vp, num_layers, **config_overrides):
    from megatron.core import parallel_state as ps

    values = dict(
        num_layers=num_layers,
        mtp_num_layers=None,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp,
        pipeline_dtype=torch.float32 if pp > 1 else None,
        recompute_granularity="full",
        recompute_method="uniform",
        recompute_num_layers=1,
    )
    values.update(config_overrides)
    config = replay_config(**values)
    spec = get_gpt_layer_local_spec(num_experts=NUM_EXPERTS, moe_grouped_gemm=False)
    chunks = []
    for stage in range(vp or 1):
        vp_stage = stage if vp else None
        chunks.append(
            GPTModel(
                config,
                spec,
                vocab_size=64,
                max_sequence_length=SEQ,
                pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
                post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
                vp_stage=vp_stage,
            ).to(unit_device())
        )
    for chunk in chunks:
        chunk.train()
    return chunks


def _steps_with_forward_only_between(rank, world_size, interleaved):
    """Training step, forward-only pass (train mode, so checkpointing is live), training step."""
    vp = 2 if interleaved else None
    Utils.initialize_model_parallel(
        pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=vp
    )
    reset_router_replay()
    torch.manual_seed(7)
    chunks = _chunks(pp=2, vp=vp, num_layers=4)
    layer_numbers = list(range(1, 5))
    local = sorted(n for c in chunks for n in RouterReplay.get_replay_layer_numbers(c))
    assert len(local) == 2, local
    schedule = (
        schedules.forward_backward_pipelining_with_interleaving
        if interleaved
        else schedules.forward_backward_pipelining_without_interleaving
    )
    _train_forward_only_train(chunks, schedule, layer_numbers)


def _expert_parallel_steps(rank, world_size, dispatcher):
    """The same protocol with experts split over two ranks (EP=2, no pipeline)."""
    Utils.initialize_model_parallel(expert_model_parallel_size=2)
    reset_router_replay()
    torch.manual_seed(7)
    chunks = _chunks(
        pp=1,
        vp=None,
        num_layers=2,
        expert_model_parallel_size=2,
        moe_token_dispatcher_type=dispatcher,
        recompute_num_layers=2,  # one checkpoint over both layers
    )
    _train_forward_only_train(chunks, _forwards_then_backwards, [1, 2])


def _train_forward_only_train(chunks, schedule, layer_numbers):
    probe = ScheduleProbe(chunks)
    RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD, model=chunks)

    for step, seed in enumerate((11, 22)):
        if step:
            # Old log-probs / reference forward between the steps, with other replay data.
            reference = _replay_data(99, layer_numbers)
            with torch.no_grad():
                probe.run(schedule, reference, forward_only=True)
            probe.check(reference, expect_recompute=False)
        replay = _replay_data(seed, layer_numbers)
        probe.run(schedule, replay)
        probe.check(replay, expect_recompute=True)
        RouterReplay.clear_global_indices(model=chunks)  # the per-step reset
    reset_router_replay()


class TestRouterReplayRecomputeInProcess:
    """World size 1: micro-batches forwarded before any backward, and upstream's protocol."""

    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        reset_router_replay()
        torch.manual_seed(7)

    def teardown_method(self, method):
        reset_router_replay()
        Utils.destroy_model_parallel()

    @pytest.mark.slow
    def test_forwards_then_backwards_with_forward_only_between_steps(self):
        chunks = _chunks(pp=1, vp=None, num_layers=2)
        _train_forward_only_train(chunks, _forwards_then_backwards, [1, 2])

    def test_forward_only_pass_leaves_nothing_for_the_next_recompute(self):
        # Upstream's protocol: set data, REPLAY_FORWARD for the forward, REPLAY_BACKWARD for
        # the backward. A forward-only pass (train mode, so its layers are checkpointed) with
        # the reference data comes first; the training recompute must not replay it.
        (model,) = _chunks(pp=1, vp=None, num_layers=2)
        probe = ScheduleProbe([model])
        reference, train = _replay_data(3, [1, 2])[:2]
        tokens, position_ids, mask = causal_batch(seed=5)
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        RouterReplay.set_replay_data(reference)
        with torch.no_grad():
            model(tokens, position_ids, mask)
        RouterReplay.set_replay_data(train)
        probe.microbatch = 1
        loss = model(tokens, position_ids, mask, labels=tokens).mean()
        probe.microbatch = None
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_BACKWARD)
        loss.backward()
        recomputes = [(r, m) for r, _, grad, _, m in probe.calls if grad]
        assert len(recomputes) == 2
        for router, routing in recomputes:
            number = router.router_replay.layer_number
            assert torch.equal(routing, indices_to_map(train[number], NUM_EXPERTS)), number


class TestRecomputeRoutingBookkeeping:
    def teardown_method(self, method):
        reset_router_replay()

    def test_recompute_routing_more_often_than_its_forward_is_a_clear_error(self):
        from megatron.core.transformer.moe.router_replay import RecomputeRouting

        instance = RouterReplay()
        instance.layer_number = 3
        scores = torch.rand(TOKENS, NUM_EXPERTS)

        def free_topk(s, k, *_):
            values, indices = torch.topk(s, k, dim=1)
            return values, indices

        routing = RecomputeRouting()
        with routing.forward():
            _, kept = instance.get_replay_topk(scores, TOPK, default_compute_topk=free_topk)
        with routing.recompute():
            other = torch.rand(TOKENS, NUM_EXPERTS)
            probs, again = instance.get_replay_topk(other, TOPK, default_compute_topk=free_topk)
            assert torch.equal(again, kept) and torch.equal(probs, other.gather(1, kept))
            with pytest.raises(RuntimeError, match=r"\(layer 3\): the recompute routes this layer "
                               "more often than its checkpointed forward did"):
                instance.get_replay_topk(other, TOPK, default_compute_topk=free_topk)


class TestRouterReplayPipelineSchedulesWithFullRecompute:
    """PP=2 on two gloo ranks (CPU)."""

    @pytest.mark.slow
    def test_1f1b_schedule_with_forward_only_between_steps(self):
        run_distributed(_steps_with_forward_only_between, 2, False)

    @pytest.mark.slow
    def test_interleaved_schedule_with_forward_only_between_steps(self):
        run_distributed(_steps_with_forward_only_between, 2, True)


@pytest.mark.gpu
@pytest.mark.multi_gpu(2)
class TestRouterReplayRecomputeOnTwoGPUs:
    """The same workers with NCCL (run_distributed picks it when CUDA is present)."""

    def test_pipeline_parallel_1f1b(self):
        run_distributed(_steps_with_forward_only_between, 2, False)

    def test_pipeline_parallel_interleaved(self):
        run_distributed(_steps_with_forward_only_between, 2, True)

    def test_expert_parallel_alltoall(self):
        run_distributed(_expert_parallel_steps, 2, "alltoall")
