"""Router freeze settings: moe_router_freeze_weight keeps every router's gate (decoder and MTP)
out of the gradient and the optimizer, and refuses an optimizer built after requires_grad was
turned back on; moe_router_freeze_expert_bias keeps the aux-loss-free expert bias fixed through
the per-batch update while routing still uses it."""

import pytest
import torch

from megatron.core.distributed.finalize_model_grads import _update_router_expert_bias
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
from megatron.core.optimizer import OptimizerConfig, _get_param_groups
from megatron.core.transformer.moe.router import Router
from megatron.core.transformer.transformer_config import TransformerConfig
from tests.unit_tests.test_utilities import Utils, unit_device

SEQ, VOCAB = 16, 64


def _config(**fields):
    fields.setdefault("add_bias_linear", False)
    return TransformerConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_moe_experts=4,
        moe_router_topk=2,
        moe_token_dispatcher_type="allgather",
        mtp_num_layers=1,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        **fields,
    )


def _model(config):
    torch.manual_seed(3)
    spec = get_gpt_layer_local_spec(num_experts=4, moe_grouped_gemm=False)
    mtp = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False)
    model = GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=SEQ, mtp_block_spec=mtp)
    # Initialised on the CPU (the same numbers everywhere), then moved to unit_device(): on a CUDA
    # host Megatron's buffers and the routers' gates live on the current device.
    return model.to(unit_device())


def _step(model):
    gen = torch.Generator().manual_seed(9)
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=gen)
    labels = torch.randint(0, VOCAB, (2, SEQ), generator=gen)
    position_ids = torch.arange(SEQ).unsqueeze(0).expand(2, SEQ)
    mask = torch.triu(torch.ones(SEQ, SEQ), diagonal=1).bool()[None, None]
    device = unit_device()
    tokens, position_ids, mask, labels = (
        t.to(device) for t in (tokens, position_ids, mask, labels)
    )
    model(tokens, position_ids, mask, labels=labels).sum().backward()


def _routers(model):
    return [m for m in model.modules() if isinstance(m, Router)]


def _grouped_params(model):
    groups = _get_param_groups([model], OptimizerConfig(lr=1e-3), None)
    return {id(p) for group in groups for p in group["params"]}


class TestRouterFreezeWeight:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_gates_get_no_gradient_and_no_optimizer_group(self):
        model = _model(_config(moe_router_freeze_weight=True))
        routers = _routers(model)
        assert len(routers) == 3  # two decoder layers and the MTP layer
        gates = [r.weight for r in routers]
        _step(model)
        assert all(p.grad is None and not p.requires_grad for p in gates)
        trained = [p for p in model.parameters() if p.requires_grad]
        assert trained and all(p.grad is not None for p in trained)
        grouped = _grouped_params(model)
        assert not grouped & {id(p) for p in gates}
        assert grouped == {id(p) for p in trained}

    def test_gate_bias_is_frozen_with_the_weight(self):
        """A biased gate (add_bias_linear): the bias is frozen and refused like the weight. (A
        biased model cannot take a backward step on CPU: the expert MLP adds its fc2 bias in
        place on a view, flag or no flag.)"""
        model = _model(_config(moe_router_freeze_weight=True, add_bias_linear=True))
        for router in _routers(model):
            assert not router.weight.requires_grad and not router.bias.requires_grad
        assert not _grouped_params(model) & {id(r.bias) for r in _routers(model)}
        for router in _routers(model):
            router.bias.requires_grad_(True)
        with pytest.raises(ValueError, match=r"router\.bias is frozen by moe_router_freeze_weight"):
            _get_param_groups([model], OptimizerConfig(lr=1e-3), None)

    def test_off_by_default_gates_train(self):
        model = _model(_config())
        assert model.config.moe_router_freeze_weight is False
        _step(model)
        grouped = _grouped_params(model)
        for router in _routers(model):
            assert router.weight.grad is not None and id(router.weight) in grouped

    def test_optimizer_refuses_a_gate_that_requires_grad_again(self):
        model = _model(_config(moe_router_freeze_weight=True))
        model.requires_grad_(True)  # e.g. a framework unfreezing the whole model after build
        with pytest.raises(ValueError, match=r"router\.weight is frozen by moe_router_freeze_weight"):
            _get_param_groups([model], OptimizerConfig(lr=1e-3), None)


class TestRouterFreezeExpertBias:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def _updated(self, freeze):
        fields = dict(moe_router_enable_expert_bias=True, moe_router_score_function="sigmoid")
        if freeze is not None:
            fields["moe_router_freeze_expert_bias"] = freeze
        config = _config(**fields)
        model = _model(config)
        _step(model)
        routers = _routers(model)
        assert all(r.local_tokens_per_expert.sum() > 0 for r in routers)
        before = [r.expert_bias.clone() for r in routers]
        _update_router_expert_bias([model], config)
        return [torch.equal(b, r.expert_bias) for b, r in zip(before, routers)], routers

    def test_frozen_bias_is_not_updated(self):
        unchanged, routers = self._updated(True)
        assert all(unchanged) and all(r.frozen_expert_bias for r in routers)

    def test_off_by_default_bias_is_updated(self):
        unchanged, routers = self._updated(None)
        assert not any(unchanged)
        assert routers[0].config.moe_router_freeze_expert_bias is False

    def test_refused_without_an_expert_bias(self):
        with pytest.raises(ValueError, match="moe_router_freeze_expert_bias.*no expert bias"):
            _config(moe_router_freeze_expert_bias=True)
