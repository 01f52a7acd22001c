"""Hardening of upstream's RouterReplay for RL: layer-keyed data, clear mismatch errors,
per-model ownership (actor + reference in one process) and rejection of routing paths that
would silently ignore replay."""

import gc

import pytest
import torch

from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction
from tests.unit_tests.test_utilities import Utils, unit_device
from tests.unit_tests.transformer.moe.router_replay_helpers import (
    NUM_TOKENS,
    RoutingCapture,
    build_gpt,
    decoder_routers,
    forced_indices,
    indices_to_map,
    replay_config,
    reset_router_replay,
    run_forward,
)


class _ReplayTestBase:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        reset_router_replay()
        torch.manual_seed(99)

    def teardown_method(self, method):
        reset_router_replay()
        Utils.destroy_model_parallel()


class TestRouterReplayByLayerNumber(_ReplayTestBase):
    def test_mapping_keyed_replay_reaches_the_named_layers(self):
        model = build_gpt(replay_config(), with_mtp=True)
        model.eval()
        assert RouterReplay.get_replay_layer_numbers(model) == [1, 2]
        # Keys in a different order than construction: the mapping, not the order, decides.
        data = {2: forced_indices((2, 3)), 1: forced_indices((0, 3))}
        RouterReplay.set_replay_data(data)
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        layer1, layer2 = decoder_routers(model)
        capture = RoutingCapture([layer1, layer2])
        with torch.no_grad():
            run_forward(model)
        assert torch.equal(capture.last(layer1), indices_to_map(data[1], 4))
        assert torch.equal(capture.last(layer2), indices_to_map(data[2], 4))
        capture.remove()

    def test_recorded_data_by_layer_round_trips(self):
        model = build_gpt(replay_config(), with_mtp=True)
        model.eval()
        RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)
        with torch.no_grad():
            run_forward(model)
        recorded = RouterReplay.get_recorded_data_by_layer(model)
        assert sorted(recorded) == [1, 2]
        as_list = RouterReplay.get_recorded_data(model)
        assert torch.equal(recorded[1], as_list[0]) and torch.equal(recorded[2], as_list[1])

        RouterReplay.clear_global_indices()
        RouterReplay.set_replay_data(recorded)
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        capture = RoutingCapture(decoder_routers(model))
        with torch.no_grad():
            run_forward(model)
        for number, router in zip([1, 2], decoder_routers(model)):
            assert torch.equal(capture.last(router), indices_to_map(recorded[number], 4))
        capture.remove()


class TestRouterReplayMismatchErrors(_ReplayTestBase):
    def test_list_count_mismatch_names_expected_layers(self):
        _model = build_gpt(replay_config(), with_mtp=True)
        expected = r"replay tensors \(3\).*instances \(2\).*layers \[1, 2\]"
        with pytest.raises(ValueError, match=expected):
            RouterReplay.set_replay_data([forced_indices((0, 1))] * 3)

    def test_mapping_key_mismatch_names_missing_and_unexpected_layers(self):
        _model = build_gpt(replay_config(), with_mtp=True)
        with pytest.raises(ValueError, match=r"layers \[1, 2\]; missing \[2\], unexpected \[3\]"):
            RouterReplay.set_replay_data({1: forced_indices((0, 1)), 3: forced_indices((0, 1))})
        # Nothing was half-applied.
        assert all(r.target_topk_idx is None for r in RouterReplay.global_router_replay_instances)

    def test_wrong_token_count_is_reported_with_the_layer(self):
        model = build_gpt(replay_config(), with_mtp=True)
        RouterReplay.set_replay_data([forced_indices((0, 1), NUM_TOKENS - 1)] * 2)
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        with pytest.raises(ValueError, match=r"layer 1.*shape \(31, 2\).*expects \(32, 2\)"):
            with torch.no_grad():
                run_forward(model)

    def test_replay_without_data_is_reported(self):
        model = build_gpt(replay_config(), with_mtp=True)
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_BACKWARD)
        with pytest.raises(RuntimeError, match=r"layer 1.*replay_backward.*set_replay_data"):
            with torch.no_grad():
                run_forward(model)


class TestRouterReplayActorAndReference(_ReplayTestBase):
    def test_instances_belong_to_their_model(self):
        actor = build_gpt(replay_config(), with_mtp=True)
        reference = build_gpt(replay_config(), with_mtp=True)
        actor_instances = RouterReplay.get_instances(actor)
        ref_instances = RouterReplay.get_instances(reference)
        assert actor_instances == [r.router_replay for r in decoder_routers(actor)]
        assert ref_instances == [r.router_replay for r in decoder_routers(reference)]
        assert not {id(r) for r in actor_instances} & {id(r) for r in ref_instances}
        assert RouterReplay.global_router_replay_instances == actor_instances + ref_instances

        # A bare list cannot say which model it is for: refused, not silently misassigned.
        with pytest.raises(ValueError, match=r"more than one model.*model="):
            RouterReplay.set_replay_data([forced_indices((0, 1))] * 2)
        with pytest.raises(ValueError, match=r"more than one model"):
            RouterReplay.get_recorded_data()

        RouterReplay.set_replay_data([forced_indices((0, 1))] * 2, model=actor)
        assert all(r.target_topk_idx is not None for r in actor_instances)
        assert all(r.target_topk_idx is None for r in ref_instances)

    def test_model_scoped_actions_and_shared_mapping(self):
        actor = build_gpt(replay_config(), with_mtp=True)
        reference = build_gpt(replay_config(), with_mtp=True)
        actor.eval(), reference.eval()
        capture = RoutingCapture(decoder_routers(actor) + decoder_routers(reference))

        # Record on the actor only.
        RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD, model=actor)
        with torch.no_grad():
            run_forward(actor)
            run_forward(reference)
        recorded = RouterReplay.get_recorded_data_by_layer(actor)
        assert all(v is not None for v in recorded.values())
        assert all(v is None for v in RouterReplay.get_recorded_data(reference))

        # Keyed by layer number, one set of replay data feeds both models (R3 for the
        # reference log-probs uses the rollout routing too).
        RouterReplay.clear_global_indices()
        RouterReplay.set_replay_data(recorded)
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        with torch.no_grad():
            run_forward(actor)
            run_forward(reference)
        for model in (actor, reference):
            for number, router in zip([1, 2], decoder_routers(model)):
                assert torch.equal(capture.last(router), indices_to_map(recorded[number], 4))
        capture.remove()

    def test_static_buffers_belong_to_their_model(self):
        # CUDA-graph recording copies each layer's routing into a slice of one static buffer;
        # with an actor and a reference model the buffer serves the model it is given for.
        actor = build_gpt(replay_config(), with_mtp=True)
        reference = build_gpt(replay_config(), with_mtp=True)
        actor.eval(), reference.eval()
        buffer = torch.full((NUM_TOKENS, 2, 2), -1, dtype=torch.long, device=unit_device())
        with pytest.raises(ValueError, match=r"set_global_static_buffers.*more than one model"):
            RouterReplay.set_global_static_buffers(buffer)
        RouterReplay.set_global_static_buffers(buffer, model=reference)
        assert all(r.static_buffer is None for r in RouterReplay.get_instances(actor))

        RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)
        with torch.no_grad():
            run_forward(reference)
        for layer, indices in enumerate(RouterReplay.get_recorded_data(reference)):
            assert indices.data_ptr() == buffer[:, layer].data_ptr()
            assert torch.equal(buffer[:, layer], indices)
        before = buffer.clone()
        with torch.no_grad():
            run_forward(actor, seed=5)  # the actor records into its own tensors, not the buffer
        assert torch.equal(buffer, before)
        assert all(v.data_ptr() != buffer.data_ptr() for v in RouterReplay.get_recorded_data(actor))

        RouterReplay.clear_global_static_buffers(model=reference)
        assert all(r.static_buffer is None for r in RouterReplay.get_instances(reference))

    def test_discarded_model_leaves_the_registry(self):
        actor = build_gpt(replay_config(), with_mtp=True)
        reference = build_gpt(replay_config(), with_mtp=True)
        assert len(RouterReplay.global_router_replay_instances) == 4
        del reference
        gc.collect()
        assert RouterReplay.global_router_replay_instances == RouterReplay.get_instances(actor)
        RouterReplay.set_replay_data([forced_indices((0, 1))] * 2)


class TestRouterReplayConfigValidation:
    @pytest.mark.parametrize(
        "overrides, culprit",
        [
            (dict(moe_router_fusion=True), "moe_router_fusion"),
            (dict(moe_router_load_balancing_type="sinkhorn"), "'sinkhorn'"),
            (
                dict(moe_router_load_balancing_type="quantile_balancing", moe_aux_loss_coeff=0.0),
                "'quantile_balancing'",
            ),
        ],
    )
    def test_replay_with_a_bypassing_router_path_is_rejected(self, overrides, culprit):
        # Without replay the same settings are accepted ...
        replay_config(moe_enable_routing_replay=False, **overrides)
        # ... with replay they are refused at config time, naming the conflicting option.
        with pytest.raises(ValueError, match=rf"moe_enable_routing_replay.*{culprit}.*ignored"):
            replay_config(**overrides)
