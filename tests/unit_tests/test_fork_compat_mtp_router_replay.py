"""An MTP layer refuses to be built when its router holds a replay object: the fork never gives
one to an MTP router, so it was put there by a replaced ``TopKRouter.__init__`` (verl 0.9.1's
``apply_router_replay_patch`` gives one to every router) and the MTP layer would replay its
routing too, outside the fork's R3."""

import pytest

from megatron.core.fork_compat import ForkSymbolReplaced
from megatron.core.transformer.moe.router import TopKRouter
from tests.unit_tests.test_utilities import Utils
from tests.unit_tests.transformer.moe.router_replay_helpers import (
    build_gpt,
    decoder_routers,
    mtp_routers,
    replay_config,
    reset_router_replay,
)

FORK_ROUTER_INIT = TopKRouter.__init__


class ForeignReplay:
    """Stands in for a framework's own replay object."""


def foreign_router_init(self, *args, **kwargs):
    """Stands in for a framework's TopKRouter.__init__ that gives every router a replay object."""
    FORK_ROUTER_INIT(self, *args, **kwargs)
    self.router_replay = ForeignReplay()


class TestMTPRouterReplayRefusedAtBuild:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        reset_router_replay()

    def teardown_method(self, method):
        reset_router_replay()
        Utils.destroy_model_parallel()

    @pytest.mark.parametrize("fork_r3", [True, False], ids=["fork_r3_on", "fork_r3_off"])
    def test_a_replaced_router_init_is_refused_at_mtp_build(self, monkeypatch, fork_r3):
        monkeypatch.setattr(TopKRouter, "__init__", foreign_router_init)
        with pytest.raises(ForkSymbolReplaced) as raised:
            build_gpt(replay_config(moe_enable_routing_replay=fork_r3))
        message = str(raised.value)
        assert "MTP layer's router" in message and "mtp_model_layer" in message
        assert f"{__name__}.ForeignReplay" in message
        assert f"TopKRouter.__init__ was replaced by {__name__}.foreign_router_init" in message
        assert f"likely patched by '{__name__.split('.')[0]}'" in message

    def test_a_replay_object_from_elsewhere_is_refused_too(self, monkeypatch):
        """TopKRouter.__init__ intact, but a subclass's init hands the MTP router a replay object."""
        monkeypatch.setattr(
            TopKRouter, "set_layer_number", _set_layer_number_with_foreign_replay, raising=True
        )
        with pytest.raises(ForkSymbolReplaced, match="an object built outside TopKRouter.__init__"):
            build_gpt(replay_config())

    def test_the_fork_alone_builds_and_keeps_mtp_routers_out(self):
        model = build_gpt(replay_config())
        assert all(r.router_replay is not None for r in decoder_routers(model))
        assert [r.router_replay for r in mtp_routers(model)] == [None]

    def test_a_model_without_mtp_builds_under_the_foreign_init(self, monkeypatch):
        monkeypatch.setattr(TopKRouter, "__init__", foreign_router_init)
        model = build_gpt(replay_config(mtp_num_layers=None))
        assert all(isinstance(r.router_replay, ForeignReplay) for r in decoder_routers(model))


FORK_SET_LAYER_NUMBER = TopKRouter.set_layer_number


def _set_layer_number_with_foreign_replay(self, layer_number):
    FORK_SET_LAYER_NUMBER(self, layer_number)
    self.router_replay = ForeignReplay()
