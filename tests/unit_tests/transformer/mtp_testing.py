"""Small helpers shared by the MTP-for-RL tests: tiny GPT+MoE+MTP models and gradient probes."""

import torch

from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_mtp_block_spec,
)
from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler
from tests.unit_tests.test_utilities import unit_device
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import (
    SEQ,
    VOCAB,
    causal_batch,
    tiny_moe_mtp_config,
)

__all__ = [
    "SEQ",
    "VOCAB",
    "causal_batch",
    "tiny_moe_mtp_config",
    "build_model",
    "deterministic_config",
    "grad_of",
    "is_zero_grad",
    "mtp_only_backward",
    "main_only_backward",
    "train_on_batch",
]


# How the MTP loss treats the output layer: live (upstream default), frozen head only (the fork's
# mtp_detach_output_layer) or frozen head + embeddings + trunk (upstream's mtp_detach_heads).
DETACH_MODES = {
    "none": {},
    "output_layer": {"mtp_detach_output_layer": True},
    "heads": {"mtp_detach_heads": True},
}


def deterministic_config(**overrides):
    """``tiny_moe_mtp_config`` without dropout, so repeated forwards are identical."""
    values = dict(hidden_dropout=0.0, attention_dropout=0.0)
    values.update(overrides)
    return tiny_moe_mtp_config(**values)


def build_model(config, tied=False, with_mtp=True, seed=1234):
    """Tiny GPTModel, initialised on the CPU and moved to ``unit_device()``; ``tied`` shares the word
    embeddings with the output layer."""
    torch.manual_seed(seed)
    spec = get_gpt_layer_local_spec(num_experts=config.num_moe_experts, moe_grouped_gemm=False)
    mtp_spec = None
    if with_mtp:
        mtp_spec = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False)
    model = GPTModel(
        config,
        spec,
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        mtp_block_spec=mtp_spec,
        share_embeddings_and_output_weights=tied,
    )
    return model.to(unit_device())


def train_on_batch(model, batch, steps, lr=3e-3):
    """``steps`` Adam steps on one fixed ``(tokens, position_ids, mask)`` batch, the tokens as their
    own labels; returns the losses. The last step's gradients stay on the parameters."""
    tokens, position_ids, mask = batch
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(tokens, position_ids, mask, labels=tokens).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def grad_of(param):
    """The gradient a parameter received: ``.grad`` plus ``main_grad`` (accumulation fusion)."""
    parts = [g for g in (param.grad, getattr(param, "main_grad", None)) if g is not None]
    if not parts:
        return None
    total = parts[0].float()
    for part in parts[1:]:
        total = total + part.float()
    return total


def is_zero_grad(param):
    grad = grad_of(param)
    return grad is None or not bool(grad.abs().sum() > 0)


def _backward(model, tokens, position_ids, mask, mtp_scale, main_scale, **kwargs):
    MTPLossAutoScaler.set_loss_scale(torch.tensor(float(mtp_scale), device=unit_device()))
    try:
        out = model(tokens, position_ids, mask, **kwargs)
        (out.float() * main_scale).sum().backward()
    finally:
        MTPLossAutoScaler.set_loss_scale(torch.tensor(1.0))
    return out


def mtp_only_backward(model, tokens, position_ids, mask, **kwargs):
    """Backward of the MTP loss alone: the main output is scaled by zero.

    The MTP loss rides on the hidden states through ``MTPLossAutoScaler`` and receives its
    gradient from that function's backward, independent of the main loss's scale.
    """
    return _backward(model, tokens, position_ids, mask, 1.0, 0.0, **kwargs)


def main_only_backward(model, tokens, position_ids, mask, **kwargs):
    """Backward of the main output alone: the MTP loss's backward scale is zero."""
    return _backward(model, tokens, position_ids, mask, 0.0, 1.0, **kwargs)


class CpuWgradAccumulation:
    """CPU stand-in for APEX's ``fused_weight_gradient_mlp_cuda`` (accumulates ``dY^T X``).

    Lets the gradient-accumulation-fusion code paths of ``tensor_parallel.layers`` and
    ``drain_embedding_wgrad_compute`` run on CPU (and on GPUs without APEX, see
    :func:`real_or_standin_wgrad_accumulation`).
    """

    @staticmethod
    def wgrad_gemm_accum_fp32(total_input, grad_output, main_grad):
        main_grad.add_(grad_output.t().matmul(total_input).to(main_grad.dtype))

    wgrad_gemm_accum_fp16 = wgrad_gemm_accum_fp32


def use_cpu_wgrad_accumulation(monkeypatch):
    """Route gradient accumulation fusion through :class:`CpuWgradAccumulation` on CPU."""
    import sys

    from megatron.core.tensor_parallel import layers

    monkeypatch.setattr(layers, "_grad_accum_fusion_available", True)
    monkeypatch.setattr(
        layers, "fused_weight_gradient_mlp_cuda", CpuWgradAccumulation, raising=False
    )
    monkeypatch.setitem(sys.modules, "fused_weight_gradient_mlp_cuda", CpuWgradAccumulation)


def real_or_standin_wgrad_accumulation(monkeypatch) -> str:
    """GPU tests: APEX's accumulation kernel when installed, else the torch stand-in.

    Everything else (CUDA tensors, the accumulation-fusion code paths, main_grad handling) is the
    real thing either way; returns which kernel ran so the test can say so.
    """
    from megatron.core.tensor_parallel import layers

    if layers._grad_accum_fusion_available:
        return "apex"
    use_cpu_wgrad_accumulation(monkeypatch)
    return "torch stand-in"


def attach_main_grads(model):
    """Give every parameter a zeroed fp32 ``main_grad`` as DDP does for accumulation fusion."""
    for param in model.parameters():
        param.main_grad = torch.zeros_like(param, dtype=torch.float32)


def reset_mtp_state():
    """Reset MTP's process-wide state (loss scale, metrics tracker sized by mtp_num_layers)."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    MTPLossAutoScaler.set_loss_scale(torch.tensor(1.0))
    MTPLossLoggingHelper.tracker.clear()
