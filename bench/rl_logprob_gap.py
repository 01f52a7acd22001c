"""Benchmark (not a test): how far a bf16 MoE + MTP policy's training log-probs are from exact.

RL compares the log-probs of its training forward with the rollout engine's. This builds a small
GPT with MoE layers and an MTP layer (local specs, allgather dispatcher) in bf16, copies the same
bf16 weights into a float64 reference model (router in fp64 too), and prints, per precision
setting, max and mean |log p(label) of the bf16 forward - log p(label) of the reference| over
``--batches`` random token batches. Log-softmax runs in float64 on both sides, so the gap is the
forward's. Settings: upstream defaults, an fp32 router, moe_router_use_torch_mm (item 1),
moe_activation_in_fp32 and moe_combine_in_fp32 (item 2, alone and together) and all of them.

    python bench/rl_logprob_gap.py                    # CPU, through megatron.core.cpu_harness
    python bench/rl_logprob_gap.py --device cuda      # CUDA (TE's router GEMM if TE is installed)
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FP32_ROUTER = {"moe_router_dtype": "fp32"}
ACT = {"moe_activation_in_fp32": True}
COMBINE = {"moe_combine_in_fp32": True}
TORCH_MM = {"moe_router_use_torch_mm": True}
VARIANTS = {
    "default": {},
    "router_fp32": FP32_ROUTER,
    "router_torch_mm": {**FP32_ROUTER, **TORCH_MM},
    "activation_fp32": {**FP32_ROUTER, **ACT},
    "combine_fp32": {**FP32_ROUTER, **COMBINE},
    "activation_combine_fp32": {**FP32_ROUTER, **ACT, **COMBINE},
    "all": {**FP32_ROUTER, **TORCH_MM, **ACT, **COMBINE},
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=512, help="expert ffn hidden size")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    p.add_argument("--json", type=Path, help="also write the figures here as JSON")
    return p.parse_args(argv)


def _with_torch_norms(spec):
    """``spec`` with every norm class that is not torch's own replaced by torch's
    (``WrappedTorchNorm``): Transformer Engine's and Apex's fused norms have no float64 kernels."""
    import dataclasses

    from megatron.core.extensions.transformer_engine import TENorm
    from megatron.core.fusions.fused_layer_norm import FusedLayerNorm
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    fused = (TENorm, FusedLayerNorm)

    def walk(node):
        if isinstance(node, type):
            return WrappedTorchNorm if node in fused else node
        if isinstance(node, ModuleSpec):
            return dataclasses.replace(node, module=walk(node.module), submodules=walk(node.submodules))
        if dataclasses.is_dataclass(node):
            fields = [f.name for f in dataclasses.fields(node) if f.init]
            return dataclasses.replace(node, **{name: walk(getattr(node, name)) for name in fields})
        if isinstance(node, (list, tuple)):
            return type(node)(walk(item) for item in node)
        return node

    return walk(spec)


def te_modules(model):
    """Names of the modules of ``model`` that come from Transformer Engine or wrap it."""
    prefixes = ("transformer_engine.", "megatron.core.extensions.transformer_engine")
    return [
        name or type(model).__name__
        for name, module in model.named_modules()
        if (type(module).__module__ + ".").startswith(prefixes)
    ]


def _model(args, dtype, fields):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_block import (
        TransformerBlock,
        TransformerBlockSubmodules,
    )

    cfg = TransformerConfig(
        num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.heads,
        ffn_hidden_size=args.ffn, moe_ffn_hidden_size=args.ffn, num_moe_experts=args.experts,
        moe_router_topk=args.topk, moe_token_dispatcher_type="allgather",
        moe_router_load_balancing_type="none", gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, mtp_num_layers=1, add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
        bf16=dtype == torch.bfloat16, params_dtype=dtype, **fields,
    )  # fmt: skip
    spec = get_gpt_layer_local_spec(num_experts=args.experts, moe_grouped_gemm=False)
    mtp = get_gpt_mtp_block_spec(cfg, spec, use_transformer_engine=False)
    if dtype == torch.float64:
        # The local layer spec still takes Apex's norm where Apex is installed, and the block's
        # final norm is Transformer Engine's where TE is: neither runs in float64. The reference
        # is built from torch's own modules only.
        spec, mtp = _with_torch_norms(spec), _with_torch_norms(mtp)
        spec = ModuleSpec(
            module=TransformerBlock,
            submodules=TransformerBlockSubmodules(
                layer_specs=[spec] * args.layers, layer_norm=WrappedTorchNorm
            ),
        )
    model = GPTModel(cfg, spec, vocab_size=args.vocab, max_sequence_length=args.seq,
                     mtp_block_spec=mtp)  # fmt: skip
    if dtype == torch.float64:
        te = te_modules(model)
        assert not te, f"the float64 reference holds Transformer Engine modules: {te}"
    # Megatron leaves a few parameters in fp32 for Float16Module to convert; convert them all.
    return model.to(device=args.device, dtype=dtype).eval()


def _load_into_reference(reference, weights):
    """Load the bf16 model's ``weights`` into the float64 reference. Where the bf16 model's final
    norm is Transformer Engine's it also saves an ``_extra_state`` entry that torch's norm lacks;
    every reference entry must come from ``weights``, and nothing else may be left over."""
    wanted = reference.state_dict().keys()
    missing = sorted(wanted - weights.keys())
    extra = sorted(k for k in weights.keys() - wanted if not k.endswith("._extra_state"))
    if missing or extra:
        raise RuntimeError(
            f"bf16 model and float64 reference differ: reference entries missing from the bf16 "
            f"state dict {missing}, bf16 entries the reference has no place for {extra}"
        )
    reference.load_state_dict({k: weights[k] for k in wanted})


def _batches(args):
    gen = torch.Generator().manual_seed(args.seed + 1)
    for _ in range(args.batches):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=gen)
        yield tokens[:, :-1].to(args.device), tokens[:, 1:].to(args.device)


@torch.no_grad()
def _logprobs(model, tokens, labels):
    seq = tokens.shape[1]
    position_ids = torch.arange(seq, device=tokens.device).unsqueeze(0).expand_as(tokens)
    mask = torch.triu(torch.ones(seq, seq, device=tokens.device), diagonal=1).bool()[None, None]
    logits = model(tokens, position_ids, mask)
    logp = torch.log_softmax(logits.double(), dim=-1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def measure(args) -> dict:
    """{variant: {"max": float, "mean": float}} against the float64 reference."""
    torch.manual_seed(args.seed)
    weights = _model(args, torch.bfloat16, {}).state_dict()
    reference = _model(args, torch.float64, {"moe_router_dtype": "fp64"})
    _load_into_reference(reference, weights)  # the same bf16 values, held in float64
    batches = list(_batches(args))
    exact = [_logprobs(reference, t, l) for t, l in batches]
    figures = {}
    for name in args.variants:
        model = _model(args, torch.bfloat16, VARIANTS[name])
        model.load_state_dict(weights)
        gaps = torch.cat([
            (_logprobs(model, t, l) - ref).abs().flatten() for (t, l), ref in zip(batches, exact)
        ])  # fmt: skip
        figures[name] = {"max": gaps.max().item(), "mean": gaps.mean().item()}
    return figures


def main(argv=None) -> dict:
    args = parse_args(argv)
    from megatron.core import cpu_harness

    with cpu_harness.single_process(seed=args.seed):
        figures = measure(args)
    print(f"|logprob(bf16) - logprob(float64)| over {args.batches} x {args.batch} x {args.seq} "
          f"tokens, device {args.device}")  # fmt: skip
    print(f"{'variant':<26}{'max':>12}{'mean':>12}")
    for name, fig in figures.items():
        print(f"{name:<26}{fig['max']:>12.3e}{fig['mean']:>12.3e}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return figures


if __name__ == "__main__":
    main()
