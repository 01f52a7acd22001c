"""Benchmark (not a test): the MTP input projection under mHC, in halves against the module path.

Builds one MTP layer of a GPT + MoE + MTP model (TE specs when Transformer Engine is importable,
else local specs) with mHC at the bench model's shape and times ``_concat_embeddings`` forward +
backward on CUDA: the embedding half projected once (patch mhc-mtp-shared-embedding-projection)
against ``eh_proj`` on the ``[s, b*n, 2h]`` concat (the module path, forced by a no-op hook).

    python bench/experiments/mhc_mtp_projection.py --seq 4096 --batch 4 --streams 4 --hidden 2048
"""

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _layer(args):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.transformer.transformer_config import TransformerConfig

    te = importlib.util.find_spec("transformer_engine") is not None
    cfg = TransformerConfig(
        num_layers=1, hidden_size=args.hidden, num_attention_heads=args.heads,
        ffn_hidden_size=args.hidden, num_moe_experts=8, moe_router_topk=2, mtp_num_layers=1,
        enable_mhc_connections=True, mhc_num_residual_streams=args.streams,
        bf16=True, params_dtype=torch.bfloat16, hidden_dropout=0.0, attention_dropout=0.0,
        moe_token_dispatcher_type="alltoall", use_cpu_initialization=True,
    )  # fmt: skip
    maker = get_gpt_layer_with_transformer_engine_spec if te else get_gpt_layer_local_spec
    spec = maker(num_experts=8, moe_grouped_gemm=False)
    mtp = get_gpt_mtp_block_spec(cfg, spec, use_transformer_engine=te)
    model = GPTModel(cfg, spec, vocab_size=1024, max_sequence_length=args.seq, mtp_block_spec=mtp)
    return model.cuda().bfloat16().mtp.layers[0], te


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    from bench.mhc_kernels import time_ms
    from megatron.core.transformer import mhc_multistream
    from tests.unit_tests.test_utilities import Utils

    Utils.initialize_model_parallel(1, 1)
    layer, te = _layer(args)
    s, b, n, h = args.seq, args.batch, args.streams, args.hidden
    ms = torch.randn(s, b, n * h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    emb = torch.randn(s, b, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(s, b, n * h, device="cuda", dtype=torch.bfloat16)

    def step():
        out = layer._concat_embeddings(ms, emb)
        out.backward(grad)

    print(f"{'TE' if te else 'local'} specs, seq {s}, batch {b}, {n} streams, hidden {h}, bf16; "
          f"halves taken: {mhc_multistream._projects_in_halves(layer)}")  # fmt: skip
    results = {}
    for name in ("halves", "module"):
        handle = layer.eh_proj.register_forward_hook(lambda *a: None) if name == "module" else None
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        med, low, _ = time_ms(step, args.repeats)
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        if handle is not None:
            handle.remove()
        results[name] = med
        print(f"{name:7s} fwd+bwd {med:7.3f} ms (min {low:.3f})  extra peak {peak:8.1f} MiB")
    print(f"halves / module: {results['halves'] / results['module']:.3f}  "
          f"saved per MTP layer and step: {results['module'] - results['halves']:.3f} ms")


if __name__ == "__main__":
    main()
