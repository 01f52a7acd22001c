"""``megatron.core.fork_compat``: fork-patched symbols replaced after import are found and named.

The replacements here are this module's own functions, installed the way RL frameworks install
theirs (on the class, or on one object); each fork feature that lives in a replaced symbol must
refuse at use, naming the symbol and the module the replacement came from.
"""

import functools
import io
import types

import pytest
import torch

from megatron.core import fork_compat, tensor_parallel
from megatron.core.fork_compat import ForkSymbolReplaced
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.tensor_parallel.random import CheckpointFunction
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction
from megatron.core.transformer.multi_token_prediction import MultiTokenPredictionLayer
from tests.unit_tests.test_utilities import Utils
from tests.unit_tests.transformer.moe.router_replay_helpers import (
    build_gpt,
    causal_batch,
    decoder_routers,
    mtp_routers,
    replay_config,
    reset_router_replay,
)

FORK_BACKWARD = CheckpointFunction.backward
FORK_ROUTER_INIT = TopKRouter.__init__
FORK_GET_EMBEDDINGS = MultiTokenPredictionLayer._get_embeddings


def foreign_backward(ctx, *grads):
    """Stands in for a framework's CheckpointFunction.backward (verl's recompute patch)."""
    return FORK_BACKWARD(ctx, *grads)


@functools.wraps(FORK_ROUTER_INIT)
def wrapped_router_init(self, *args, **kwargs):
    """functools.wraps copies megatron's __module__ onto the wrapper, as verl's patches do."""
    FORK_ROUTER_INIT(self, *args, **kwargs)


def foreign_get_embeddings(self, *args, **kwargs):
    return FORK_GET_EMBEDDINGS(self, *args, **kwargs)


class TestForkCompat:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        reset_router_replay()

    def teardown_method(self, method):
        reset_router_replay()
        Utils.destroy_model_parallel()

    def test_nothing_is_replaced_on_the_fork_alone(self):
        model = build_gpt(replay_config())
        out = io.StringIO()
        assert fork_compat.check(model, file=out) == []
        assert "no fork-patched symbol is replaced" in out.getvalue()
        recorded = set(fork_compat._originals)
        assert {
            "GPTModel._postprocess",
            "TopKRouter.__init__",
            "TopKRouter.routing",
            "CheckpointFunction.forward",
            "CheckpointFunction.backward",
            "MultiTokenPredictionLayer._get_embeddings",
            "MultiTokenPredictionBlock.forward",
        } <= recorded

    def test_class_replacement_is_listed_with_its_features_and_patcher(self, monkeypatch):
        monkeypatch.setattr(CheckpointFunction, "backward", staticmethod(foreign_backward))
        out = io.StringIO()
        found = fork_compat.check(file=out)
        assert [item.symbol for item in found] == ["CheckpointFunction.backward"]
        item = found[0]
        assert item.replacement == f"{__name__}.foreign_backward"
        assert item.patcher == __name__.split(".")[0]
        assert fork_compat.R3_RECOMPUTE in item.features and fork_compat.RECLAIM in item.features
        assert "CheckpointFunction.backward was replaced by" in out.getvalue()

    def test_a_wrapper_is_traced_to_the_module_that_wrote_it(self, monkeypatch):
        monkeypatch.setattr(TopKRouter, "__init__", wrapped_router_init)
        (item,) = fork_compat.replaced()
        assert wrapped_router_init.__module__.startswith("megatron.")
        assert item.symbol == "TopKRouter.__init__"
        assert item.replacement == f"{__name__}.wrapped_router_init"

    def test_per_object_replacement_is_found_in_the_model(self):
        model = build_gpt(replay_config())
        model._postprocess = types.MethodType(lambda self, **kw: None, model)
        assert fork_compat.replaced() == []
        (item,) = fork_compat.replaced([model])
        assert item.symbol == "GPTModel._postprocess"
        assert item.scope == "instance <model>"
        assert fork_compat.COMPUTE_MTP in item.features

    def test_r3_under_full_recompute_refuses_a_foreign_backward(self, monkeypatch):
        config = replay_config(
            recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
        )
        model = build_gpt(config)
        model.train()
        tokens, position_ids, mask = causal_batch()
        monkeypatch.setattr(CheckpointFunction, "backward", staticmethod(foreign_backward))
        with pytest.raises(ForkSymbolReplaced, match=r"CheckpointFunction\.backward was replaced"):
            RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD, model=model)
        # Set through the registry alone (no model), the checkpointed forward itself refuses.
        RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)
        with pytest.raises(ForkSymbolReplaced, match=f"{__name__}.foreign_backward"):
            model(tokens, position_ids, mask, labels=tokens)

    def test_r3_without_recompute_does_not_need_the_checkpoint(self, monkeypatch):
        model = build_gpt(replay_config())
        monkeypatch.setattr(CheckpointFunction, "backward", staticmethod(foreign_backward))
        RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD, model=model)
        tokens, position_ids, mask = causal_batch()
        model(tokens, position_ids, mask, labels=tokens).sum().backward()

    def test_r3_refuses_a_replaced_router_init(self, monkeypatch):
        monkeypatch.setattr(TopKRouter, "__init__", wrapped_router_init)
        model = build_gpt(replay_config())
        with pytest.raises(ForkSymbolReplaced, match=r"TopKRouter\.__init__ was replaced by"):
            RouterReplay.set_replay_data({}, model=model)

    def test_r3_counts_the_replay_instances_of_the_model(self):
        model = build_gpt(replay_config())
        assert len(RouterReplay.get_instances(model)) == len(decoder_routers(model)) == 2
        (mtp_router,) = mtp_routers(model)
        mtp_router.router_replay = types.SimpleNamespace()  # what a foreign __init__ leaves
        with pytest.raises(ForkSymbolReplaced, match=r"2 hold a megatron RouterReplay, and 1 MTP"):
            RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD, model=model)
        mtp_router.router_replay = None
        decoder_routers(model)[0].router_replay = types.SimpleNamespace()
        with pytest.raises(ForkSymbolReplaced, match=r"2 MoE decoder routers .* but 1 hold"):
            RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD, model=model)

    def test_reclaim_refuses_a_foreign_backward(self, monkeypatch):
        monkeypatch.setattr(CheckpointFunction, "backward", staticmethod(foreign_backward))
        x = torch.randn(4, 4, requires_grad=True)
        tensor_parallel.checkpoint(torch.sin, False, x)  # plain recompute still runs
        refusal = r"recompute_reclaim_inputs \(recompute-reclaim-declared-inputs\) is configured"
        with pytest.raises(ForkSymbolReplaced, match=refusal):
            tensor_parallel.checkpoint(torch.sin, False, x, reclaim_inputs=(0,))

    def test_mtp_detach_output_layer_refuses_a_foreign_get_embeddings(self):
        model = build_gpt(
            replay_config(moe_enable_routing_replay=False, mtp_detach_output_layer=True)
        )
        (layer,) = model.mtp.layers
        layer._get_embeddings = types.MethodType(foreign_get_embeddings, layer)
        tokens, position_ids, mask = causal_batch()
        with pytest.raises(ForkSymbolReplaced, match=r"MultiTokenPredictionLayer\._get_embeddings"):
            model(tokens, position_ids, mask, labels=tokens)
        model.config.mtp_detach_output_layer = False
        model(tokens, position_ids, mask, labels=tokens)  # without the fork flag it just runs

    def test_recording_an_unknown_symbol_is_an_error(self):
        with pytest.raises(KeyError, match=r"GPTModel\.forward has no entry"):
            fork_compat.record(GPTModel, "forward")
