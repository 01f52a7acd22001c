"""Routing replay (``moe_enable_routing_replay``) leaves MTP-layer routers out.

Rollout engines report the routing of the decoder MoE layers only, and MTP layers see rolled
inputs, so MTP routers must never register a ``RouterReplay`` instance and must route freely
whatever the global replay action is.
"""

import copy

import pytest
import torch

from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.moe.router import InferenceTopKRouter
from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction
from tests.unit_tests.test_utilities import Utils, unit_device
from tests.unit_tests.transformer.moe.router_replay_helpers import (
    RoutingCapture,
    build_gpt,
    decoder_routers,
    experts_used,
    forced_indices,
    indices_to_map,
    mtp_routers,
    replay_config,
    reset_router_replay,
    run_forward,
)


class TestRouterReplayMTPBypass:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        reset_router_replay()
        torch.manual_seed(1234)

    def teardown_method(self, method):
        reset_router_replay()
        Utils.destroy_model_parallel()

    def test_instance_count_and_order_with_mtp(self):
        model = build_gpt(replay_config(), with_mtp=True)
        instances = RouterReplay.global_router_replay_instances
        assert len(instances) == 2, [r.layer_number for r in instances]
        assert instances == [r.router_replay for r in decoder_routers(model)]
        assert [r.layer_number for r in instances] == [1, 2]
        mtp = mtp_routers(model)
        assert len(mtp) == 1 and mtp[0].is_mtp_layer
        assert mtp[0].router_replay is None

    def test_instance_count_and_order_without_mtp(self):
        model = build_gpt(replay_config(mtp_num_layers=None), with_mtp=False)
        assert not mtp_routers(model)
        instances = RouterReplay.global_router_replay_instances
        assert instances == [r.router_replay for r in decoder_routers(model)]
        assert [r.layer_number for r in instances] == [1, 2]

    def test_inference_router_keeps_the_mtp_flag(self):
        config = replay_config(moe_router_load_balancing_type="none")
        pg = ProcessGroupCollection.use_mpu_process_groups()
        mtp_router = InferenceTopKRouter(config=config, pg_collection=pg, is_mtp_layer=True)
        decoder_router = InferenceTopKRouter(config=config, pg_collection=pg)
        mtp_router, decoder_router = mtp_router.to(unit_device()), decoder_router.to(unit_device())
        assert mtp_router.is_mtp_layer and mtp_router.router_replay is None
        assert RouterReplay.global_router_replay_instances == [decoder_router.router_replay]

    def test_no_instances_without_replay(self):
        _model = build_gpt(replay_config(moe_enable_routing_replay=False), with_mtp=True)
        assert RouterReplay.global_router_replay_instances == []

    def test_decoder_only_replay_data_is_accepted(self):
        model = build_gpt(replay_config(), with_mtp=True)
        assert len(RouterReplay.global_router_replay_instances) == 2
        # Exactly what a rollout engine reports: one tensor per decoder MoE layer.
        RouterReplay.set_replay_data([forced_indices((0, 1)), forced_indices((2, 3))])
        targets = [r.target_topk_idx for r in RouterReplay.global_router_replay_instances]
        assert torch.equal(targets[0], forced_indices((0, 1)))
        assert torch.equal(targets[1], forced_indices((2, 3)))

    def test_replay_forces_decoder_routing_and_mtp_routes_freely(self):
        model = build_gpt(replay_config(), with_mtp=True)
        model.eval()
        dec, mtp = decoder_routers(model), mtp_routers(model)
        capture = RoutingCapture(dec + mtp)

        forced = forced_indices((0, 1))
        RouterReplay.set_replay_data([forced, forced])
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        with torch.no_grad():
            run_forward(model)
        for router in dec:
            assert torch.equal(capture.last(router), indices_to_map(forced, 4))
        # The MTP router ignored the replay action: it picked by its own scores, which here
        # means experts outside the replayed set.
        mtp_map = capture.last(mtp[0])
        assert torch.equal(mtp_map, capture.free_choice(mtp[0]))
        assert experts_used(mtp_map) - {0, 1}
        capture.remove()

    def test_record_collects_decoder_layers_only(self):
        model = build_gpt(replay_config(), with_mtp=True)
        model.eval()
        dec = decoder_routers(model)
        capture = RoutingCapture(dec)
        RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)
        with torch.no_grad():
            run_forward(model)
        recorded = RouterReplay.get_recorded_data()
        assert len(recorded) == len(dec)
        for router, indices in zip(dec, recorded):
            assert torch.equal(indices_to_map(indices, 4), capture.last(router))
        capture.remove()

    def test_replay_backward_action_leaves_mtp_router_alone(self):
        # REPLAY_BACKWARD outside a recompute replays the data set for this forward on the
        # decoder routers only; the MTP router must not take the decoder layers' data.
        model = build_gpt(replay_config(), with_mtp=True)
        model.eval()
        forced = forced_indices((2, 3))
        RouterReplay.set_replay_data([forced, forced])
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_BACKWARD)
        mtp = mtp_routers(model)
        capture = RoutingCapture(decoder_routers(model) + mtp)
        with torch.no_grad():
            run_forward(model)
        for router in decoder_routers(model):
            assert torch.equal(capture.last(router), indices_to_map(forced, 4))
        assert torch.equal(capture.last(mtp[0]), capture.free_choice(mtp[0]))
        capture.remove()


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


class TestRouterReplayUnderFullRecompute:
    """REPLAY_BACKWARD for the backward: decoder recomputes replay, MTP routers route freely."""

    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        reset_router_replay()
        torch.manual_seed(4321)

    def teardown_method(self, method):
        reset_router_replay()
        Utils.destroy_model_parallel()

    @staticmethod
    def _config(recompute):
        extra = dict(hidden_dropout=0.0, attention_dropout=0.0)
        if recompute:
            extra.update(
                recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
            )
        return replay_config(**extra)

    def _replayed_recompute_grads(self, state, replay_data):
        reset_router_replay()
        model = build_gpt(self._config(recompute=True), with_mtp=True)
        model.load_state_dict(state)
        RouterReplay.set_replay_data(replay_data)
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        loss = run_forward(model).mean()
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_BACKWARD)
        loss.backward()
        return loss.detach(), _grads(model)

    @pytest.mark.slow
    def test_replayed_recompute_matches_normal_routing(self):
        reference = build_gpt(self._config(recompute=False), with_mtp=True)
        state = copy.deepcopy(reference.state_dict())
        RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)
        ref_loss = run_forward(reference).mean()
        ref_loss.backward()
        recorded = [t.clone() for t in RouterReplay.get_recorded_data()]
        ref_grads = _grads(reference)
        assert any(n.startswith("mtp.") for n in ref_grads)

        loss, grads = self._replayed_recompute_grads(state, recorded)
        assert torch.equal(loss, ref_loss.detach())
        assert grads.keys() == ref_grads.keys()
        for name, grad in ref_grads.items():
            assert torch.equal(grads[name], grad), name

    @pytest.mark.slow
    def test_replayed_recompute_matches_forced_routing_without_recompute(self):
        forced = [forced_indices((1, 3)), forced_indices((0, 2))]
        model = build_gpt(self._config(recompute=False), with_mtp=True)
        state = copy.deepcopy(model.state_dict())
        RouterReplay.set_replay_data(forced)
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        ref_loss = run_forward(model).mean()
        ref_loss.backward()
        ref_grads = _grads(model)

        loss, grads = self._replayed_recompute_grads(state, forced)
        assert torch.equal(loss, ref_loss.detach())
        for name, grad in ref_grads.items():
            assert torch.equal(grads[name], grad), name
