"""A tiny GPTModel with MoE and one MTP layer runs forward and backward on CPU (gloo).

This is the smoke test the rest of the suite builds on: if the CPU harness or a patch breaks the
basic training path, every parameter that should learn must still get a gradient.
"""

import pytest
import torch

from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_mtp_block_spec,
)
from megatron.core.transformer import TransformerConfig
from tests.unit_tests.test_utilities import Utils, unit_device

SEQ, BATCH, VOCAB = 16, 2, 64


def tiny_moe_mtp_config(**overrides):
    values = dict(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        use_cpu_initialization=True,
        num_moe_experts=4,
        moe_router_topk=2,
        moe_token_dispatcher_type="allgather",
        mtp_num_layers=1,
        add_bias_linear=False,
        bf16=False,
        params_dtype=torch.float32,
    )
    values.update(overrides)
    return TransformerConfig(**values)


def build_gpt(config, with_mtp=True):
    """Initialised on the CPU (the same numbers everywhere), then moved to :func:`unit_device`."""
    spec = get_gpt_layer_local_spec(num_experts=config.num_moe_experts, moe_grouped_gemm=False)
    mtp_spec = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False) if with_mtp else None
    model = GPTModel(
        config, spec, vocab_size=VOCAB, max_sequence_length=SEQ, mtp_block_spec=mtp_spec
    )
    return model.to(unit_device())


def causal_batch(seed=0):
    """Tokens, positions and a causal mask on :func:`unit_device`, drawn on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    position_ids = torch.arange(SEQ).unsqueeze(0).expand(BATCH, SEQ)
    mask = torch.triu(torch.ones(SEQ, SEQ), diagonal=1).bool()[None, None]
    device = unit_device()
    return tokens.to(device), position_ids.to(device), mask.to(device)


class TestGPTModelMoEMTPOnCPU:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_forward_backward_reaches_every_parameter(self):
        model = build_gpt(tiny_moe_mtp_config())
        assert model.mtp_process, "the model must actually have an MTP block"
        tokens, position_ids, mask = causal_batch()
        loss = model(tokens, position_ids, mask, labels=tokens)
        assert loss.shape == (BATCH, SEQ)
        assert torch.isfinite(loss).all()
        loss.mean().backward()
        missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
        assert not missing, f"parameters without a gradient: {missing}"
        zero = [n for n, p in model.named_parameters() if p.grad is not None and not p.grad.abs().sum() > 0]
        assert not zero, f"parameters whose gradient is exactly zero: {zero}"
        mtp_params = [n for n, _ in model.named_parameters() if n.startswith("mtp.")]
        assert mtp_params, "expected MTP parameters"

    def test_logits_without_labels(self):
        model = build_gpt(tiny_moe_mtp_config())
        tokens, position_ids, mask = causal_batch()
        logits = model(tokens, position_ids, mask)
        assert logits.shape == (BATCH, SEQ, VOCAB)
