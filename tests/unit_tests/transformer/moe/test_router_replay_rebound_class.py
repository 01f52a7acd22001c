"""A router with R3 on refuses, at build, a ``RouterReplay`` name rebound to a foreign class.

verl 0.9.1's ``apply_router_replay_patch``, on a base that has DeepSeek-V4's hash router (upstream
``dev``), rebinds ``megatron.core.transformer.moe.router.RouterReplay`` to its own class, whose
constructor takes no ``owner``; the fork's router then died with a TypeError while being built.
"""

import pytest
import torch

from megatron.core.fork_compat import ForkSymbolReplaced
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.moe import router as router_module
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.router_replay import RouterReplay
from megatron.core.transformer.transformer_config import TransformerConfig
from tests.unit_tests.test_utilities import Utils, unit_device


class ForeignReplay:
    """Stands in for a framework's own replay class: no ``owner`` argument, not the fork's."""

    instances = []

    def __init__(self):
        ForeignReplay.instances.append(self)


class ExtendedReplay(RouterReplay):
    """A framework that extends the fork's class instead of replacing it."""


def _build_router(replay=True, mtp=False):
    config = TransformerConfig(
        num_layers=1,
        hidden_size=32,
        num_attention_heads=4,
        num_moe_experts=4,
        moe_router_topk=2,
        moe_enable_routing_replay=replay,
        use_cpu_initialization=True,
    )
    router = TopKRouter(
        config=config,
        pg_collection=ProcessGroupCollection.use_mpu_process_groups(),
        is_mtp_layer=mtp,
    )
    return router.to(unit_device())


class TestReboundRouterReplayClass:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        RouterReplay.clear_global_router_replay_instances()
        ForeignReplay.instances.clear()

    def teardown_method(self, method):
        RouterReplay.clear_global_router_replay_instances()
        Utils.destroy_model_parallel()

    def test_a_foreign_class_is_refused_at_build_by_name(self, monkeypatch):
        monkeypatch.setattr(router_module, "RouterReplay", ForeignReplay)
        with pytest.raises(ForkSymbolReplaced) as raised:
            _build_router()
        message = str(raised.value)
        assert f"rebound to {__name__}.ForeignReplay" in message
        assert f"likely patched by '{__name__.split('.')[0]}'" in message
        assert "moe_enable_routing_replay" in message
        assert ForeignReplay.instances == []

    def test_a_rebinding_that_is_not_a_class_is_refused_by_name(self, monkeypatch):
        """A factory function in the class's place (it would even build the fork's object) is
        refused the same way, not met with a TypeError from the subclass check."""

        def replay_factory(owner):
            return RouterReplay(owner=owner)

        monkeypatch.setattr(router_module, "RouterReplay", replay_factory)
        with pytest.raises(ForkSymbolReplaced) as raised:
            _build_router()
        assert f"rebound to {__name__}.{replay_factory.__qualname__}" in str(raised.value)
        assert RouterReplay.global_router_replay_instances == []

    def test_a_subclass_of_the_fork_class_is_built_and_registered(self, monkeypatch):
        monkeypatch.setattr(router_module, "RouterReplay", ExtendedReplay)
        router = _build_router()
        assert type(router.router_replay) is ExtendedReplay
        assert RouterReplay.global_router_replay_instances == [router.router_replay]

    def test_the_fork_class_is_built(self):
        router = _build_router()
        assert type(router.router_replay) is RouterReplay
        assert RouterReplay.global_router_replay_instances == [router.router_replay]

    @pytest.mark.parametrize("replay, mtp", [(False, False), (True, True)], ids=["r3_off", "mtp"])
    def test_routers_without_replay_ignore_the_rebinding(self, monkeypatch, replay, mtp):
        monkeypatch.setattr(router_module, "RouterReplay", ForeignReplay)
        router = _build_router(replay=replay, mtp=mtp)
        assert router.router_replay is None
        assert ForeignReplay.instances == []
        assert isinstance(router.weight, torch.nn.Parameter)
