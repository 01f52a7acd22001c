"""Router top-k is sorted in grad and no-grad forwards alike, so a no-grad log-prob forward and a
grad-enabled training forward select, order and normalise the experts identically."""

import pytest
import torch

from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.transformer_config import TransformerConfig
from tests.unit_tests.test_utilities import Utils, unit_device

NUM_TOKENS, NUM_EXPERTS, TOPK = 64, 16, 4


def _route(logits, grad, **kwargs):
    with torch.set_grad_enabled(grad):
        probs, indices = topk_routing_with_score_function(
            logits, TOPK, dense_output=True, **kwargs
        )
    return probs.detach(), indices


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(score_function="softmax"),
        dict(score_function="softmax", use_pre_softmax=True),
        dict(score_function="sigmoid"),
        dict(score_function="sigmoid", num_groups=4, group_topk=2),
    ],
    ids=["softmax", "pre_softmax", "sigmoid", "sigmoid_grouped"],
)
class TestTopkRoutingSorted:
    def test_grad_and_no_grad_give_identical_routing(self, kwargs):
        logits = torch.randn(NUM_TOKENS, NUM_EXPERTS, generator=torch.Generator().manual_seed(7))
        logits.requires_grad_(True)
        probs_grad, idx_grad = _route(logits, True, **kwargs)
        probs_nograd, idx_nograd = _route(logits, False, **kwargs)
        assert torch.equal(idx_grad, idx_nograd)
        assert torch.equal(probs_grad, probs_nograd)

    def test_no_grad_selection_is_sorted_by_score(self, kwargs):
        logits = torch.randn(NUM_TOKENS, NUM_EXPERTS, generator=torch.Generator().manual_seed(8))
        _, indices = _route(logits, False, **kwargs)
        if kwargs["score_function"] == "sigmoid":
            scores = logits.sigmoid()
        elif kwargs.get("use_pre_softmax"):
            scores = torch.softmax(logits, -1)
        else:
            scores = logits
        picked = scores.gather(1, indices)
        assert (picked[:, :-1] >= picked[:, 1:]).all()


class TestTopKRouterSorted:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_router_probs_identical_in_grad_and_no_grad(self):
        config = TransformerConfig(
            num_layers=1,
            hidden_size=32,
            num_attention_heads=4,
            num_moe_experts=NUM_EXPERTS,
            moe_router_topk=TOPK,
            moe_router_load_balancing_type="none",
            use_cpu_initialization=True,
            add_bias_linear=False,
        )
        torch.manual_seed(3)
        router = TopKRouter(
            config=config, pg_collection=ProcessGroupCollection.use_mpu_process_groups()
        )
        router.set_layer_number(1)
        router.to(unit_device())
        hidden = torch.randn(16, 2, 32).to(unit_device())
        probs_grad, map_grad = router(hidden)
        with torch.no_grad():
            probs_nograd, map_nograd = router(hidden)
        assert torch.equal(map_grad, map_nograd)
        assert torch.equal(probs_grad.detach(), probs_nograd)
