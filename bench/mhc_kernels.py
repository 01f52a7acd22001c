"""Benchmark (not a test): one mHC sublayer, native functions vs the fused Triton kernels, on CUDA.

Times mappings + pre-aggregate + post-combine forward and backward at the bench model's shape
(tokens = batch * seq, n streams, hidden h, bf16) with CUDA events (median of repeats) and
reports the bytes the fused path must move at least, so the time can be read against the
memory bandwidth, plus the peak memory of one sublayer's forward + backward.

    python bench/mhc_kernels.py --tokens 8192 --streams 4 --hidden 2048
"""

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def sublayer(mod, p, n, iters):
    h_pre, h_post, h_res = mod.mhc_mappings(
        p["x"], p["w"], p["b"], p["a_pre"], p["a_post"], p["a_res"],
        num_streams=n, sinkhorn_iters=iters, norm_eps=1e-5,
    )  # fmt: skip
    u = mod.pre_aggregate(p["x"], h_pre)
    return mod.post_combine(p["x"], h_res, h_post, u * 0.5)


def time_ms(fn, repeats):
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), min(times), max(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=30)
    a = ap.parse_args()
    from megatron.core.transformer import hyper_connection as native
    from megatron.core.transformer import hyper_connection_fused as fused

    T, n, h = a.tokens, a.streams, a.hidden
    C = n * n + 2 * n
    g = torch.Generator(device="cuda").manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    p = dict(
        x=torch.randn(T, n * h, generator=g, **bf), w=torch.randn(C, n * h, generator=g, **bf) * 0.02,
        b=torch.randn(C, generator=g, **bf), a_pre=torch.full((1,), 0.5, **bf),
        a_post=torch.full((1,), 0.5, **bf), a_res=torch.full((1,), 0.5, **bf),
    )  # fmt: skip
    p = {k: v.requires_grad_(True) for k, v in p.items()}
    gout = torch.randn(T, n * h, generator=g, **bf)
    stream_bytes = T * n * h * 2
    # fused minimum: fwd reads x three times, writes u and x'; bwd reads x, g, y and writes dx
    # (three times, summed by autograd) and dy -- counted in whole [T, n*h] / [T, h] passes.
    fwd_bytes = 3 * stream_bytes + stream_bytes + 2 * T * h * 2
    print(f"tokens {T}, streams {n}, hidden {h}, bf16; one [T, n*h] pass = {stream_bytes / 2**20:.0f} MiB")
    for name, mod in (("native", native), ("fused", fused)):
        def fwd():
            return sublayer(mod, p, n, a.iters)

        def fwd_bwd():
            out = fwd()
            torch.autograd.backward(out, gout)

        for _ in range(3):
            fwd_bwd()
        torch.cuda.synchronize()
        f = time_ms(lambda: fwd(), a.repeats)
        fb = time_ms(fwd_bwd, a.repeats)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fwd_bwd()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        print(f"{name:7} fwd {f[0]:7.3f} ms ({f[1]:.3f}-{f[2]:.3f})  fwd+bwd {fb[0]:7.3f} ms "
              f"({fb[1]:.3f}-{fb[2]:.3f})  extra peak {peak:8.1f} MiB  "
              f"fwd GB/s at the fused minimum {fwd_bytes / f[0] / 1e6:7.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
