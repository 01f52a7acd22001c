"""Tiny GPT + MoE (+ MTP) models and token batches shared by the examples (CPU-sized) and the
client-library tests (tests/integration/clients.py, which asks for a smaller one)."""

import logging

import torch

from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
from megatron.core.transformer import TransformerConfig

SEQ_LEN, BATCH, VOCAB = 32, 4, 128


class _DropGPTModelDeprecation(logging.Filter):
    """Drops upstream 0.19's "GPTModel IS DEPRECATED" notice, logged at every GPTModel construction.

    Why: it points to ``docs/user-guide/hybrid-model-migration.md``, a file of upstream's repository
    that the installed package does not have, and it asks for a migration these examples must not
    make (the fork's MTP, mHC and R3 work is on GPTModel). docs/using.md says where the guide is.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("GPTModel IS DEPRECATED")


logging.getLogger("megatron.core.models.gpt.gpt_model").addFilter(_DropGPTModelDeprecation())


def moe_config(**overrides) -> TransformerConfig:
    """Two decoder layers with 4 experts (top-2) and one MTP layer, fp32, dropout off."""
    fields = dict(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_moe_experts=4,
        moe_router_topk=2,
        moe_token_dispatcher_type="allgather",
        mtp_num_layers=1,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
    )
    fields.update(overrides)
    # Set explicitly what upstream would fill in with a UserWarning on every config: the experts'
    # width (upstream falls back to ffn_hidden_size, 4x hidden) and the CUDA-graph modules
    # (upstream's default "full" is deprecated there; with CUDA graphs off neither matters).
    fields.setdefault("moe_ffn_hidden_size", fields.get("ffn_hidden_size") or 4 * fields["hidden_size"])
    fields.setdefault("cuda_graph_modules", [])
    return TransformerConfig(**fields)


def device() -> torch.device:
    """The current CUDA device where there is one (Megatron's buffers live there), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gpt(config: TransformerConfig, with_mtp: bool = True, vocab: int = VOCAB, seq_len: int = SEQ_LEN) -> GPTModel:
    """GPTModel on local (non-TE) specs, with the MTP block ``config`` asks for unless ``with_mtp`` is
    off; initialised on the CPU, then moved to :func:`device`."""
    spec = get_gpt_layer_local_spec(num_experts=config.num_moe_experts, moe_grouped_gemm=False)
    mtp_spec = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False) if with_mtp else None
    model = GPTModel(config, spec, vocab_size=vocab, max_sequence_length=seq_len, mtp_block_spec=mtp_spec)
    return model.to(device())


def token_batch(seed: int = 0, batch: int = BATCH, seq_len: int = SEQ_LEN, vocab: int = VOCAB):
    """Random tokens with positions and a causal mask on :func:`device`: the inputs GPTModel.forward takes."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    positions = torch.arange(seq_len).expand(batch, seq_len)
    causal_mask = torch.triu(torch.ones(seq_len, seq_len), diagonal=1).bool()[None, None]
    return tokens.to(device()), positions.to(device()), causal_mask.to(device())


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens[:, t+1] | tokens[:, :t+1]) for every position but the last: [batch, seq-1]."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
