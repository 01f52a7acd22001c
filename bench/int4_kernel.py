"""Benchmark (not a test): INT4 fake-QAT quantize-dequantize, torch reference vs the fused kernel.

Times one call on one expert weight and one MoE layer's worth of calls (every expert's fc1 and fc2,
what TEGroupedLinear fetches per forward) at the bench model's shapes (bench/te_bench.py: 8
experts, hidden 2048, ffn = hidden, no gated unit), with CUDA events, median of repeats. Also
prints the bytes one call must move (read the weight, write its image) as an effective bandwidth,
and checks the two agree bit for bit before timing. Then the grouped launch (one per grouped
linear: fc1's experts, fc2's experts) alone and through the straight-through autograd function
TEGroupedLinear's forward calls.

    python bench/int4_kernel.py [--experts 8 --hidden 2048 --ffn 2048 --group 128]
"""

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.mhc_kernels import gpu_ms  # noqa: E402  (CUDA-event timing, shared)


def median_ms(fn, calls, repeats):
    """Median over ``repeats`` of the GPU time per call (each timing warms ``fn`` first)."""
    return statistics.median(gpu_ms(fn, calls) for _ in range(repeats))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=0, help="expert ffn size (0: = hidden, as te_bench)")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/int4_kernel.py needs a CUDA device")
    from megatron.core.transformer.moe import int4_fake_qat as qat
    from megatron.core.transformer.moe import int4_fake_qat_triton as fused

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    ffn = a.ffn or a.hidden
    gen = torch.Generator(device="cuda").manual_seed(0)

    def weight(rows, cols):
        return (torch.randn(rows, cols, generator=gen, device="cuda") * 0.02).to(dtype)

    fc1 = [weight(ffn, a.hidden) for _ in range(a.experts)]
    fc2 = [weight(a.hidden, ffn) for _ in range(a.experts)]
    layer = fc1 + fc2

    def reference(ws):
        return [qat.int4_quantize_dequantize(w, a.group) for w in ws]

    def kernel(ws):
        return [
            fused.int4_quantize_dequantize_triton(w, a.group, qat.INT4_MAX_LEVEL, qat.MIN_SCALE)
            for w in ws
        ]

    def grouped(groups):  # one launch per grouped linear (fc1's experts, fc2's experts)
        return [
            fused.int4_quantize_dequantize_triton_grouped(g, a.group, qat.INT4_MAX_LEVEL, qat.MIN_SCALE)
            for g in groups
        ]

    def straight_through(groups):  # what TEGroupedLinear calls per forward, autograd included
        return [qat.int4_fake_quantize_group(g, a.group) for g in groups]

    layer_grouped = [t for g in grouped([fc1, fc2]) for t in g.unbind(0)]
    for w, r, k, g in zip(layer, reference(layer), kernel(layer), layer_grouped):
        for name, got in (("kernel", k), ("grouped kernel", g)):
            if not torch.equal(r.view(torch.int8), got.view(torch.int8)):
                sys.exit(f"{name} and reference differ on a {tuple(w.shape)} {dtype} weight")

    print(
        f"{torch.cuda.get_device_name()}  torch {torch.__version__}  {a.experts} experts  "
        f"fc1 {ffn}x{a.hidden}  fc2 {a.hidden}x{ffn}  group {a.group}  {a.dtype}  (bit-identical)"
    )
    one_bytes = 2 * fc1[0].numel() * fc1[0].element_size()
    rows = [("one weight", [fc1[0]]), (f"one layer ({len(layer)} weights)", layer)]
    print(f"{'what':<24} {'reference ms':>13} {'fused ms':>10} {'speed-up':>9} {'fused GB/s':>11}")
    for name, ws in rows:
        ref_ms = median_ms(lambda: reference(ws), a.calls, a.repeats)
        ker_ms = median_ms(lambda: kernel(ws), a.calls, a.repeats)
        gbps = one_bytes * len(ws) / (ker_ms * 1e-3) / 1e9
        print(f"{name:<24} {ref_ms:13.4f} {ker_ms:10.4f} {ref_ms / ker_ms:8.2f}x {gbps:11.0f}")
    params = [[w.clone().requires_grad_() for w in g] for g in (fc1, fc2)]
    for name, fn in (("grouped kernel", lambda: grouped([fc1, fc2])),
                     ("grouped, with autograd", lambda: straight_through(params))):  # fmt: skip
        ms = median_ms(fn, a.calls, a.repeats)
        gbps = one_bytes * len(layer) / (ms * 1e-3) / 1e9
        print(f"{name + ' (layer)':<24} {'':>13} {ms:10.4f} {'':>9} {gbps:11.0f}")


if __name__ == "__main__":
    main()
