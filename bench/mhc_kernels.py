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


def sublayer(mod, p, n, iters, split=False):
    """What HyperConnection does per sublayer (``mhc_input``, then ``post_combine``); ``split``:
    through the separate functions instead (mappings, then pre-aggregate: three dx tensors)."""
    args = (p["x"], p["w"], p["b"], p["a_pre"], p["a_post"], p["a_res"])
    kw = dict(num_streams=n, sinkhorn_iters=iters, norm_eps=1e-5)
    if split:
        h_pre, h_post, h_res = mod.mhc_mappings(*args, **kw)
        u = mod.pre_aggregate(p["x"], h_pre)
    else:
        u, h_post, h_res = mod.mhc_input(*args, **kw)
    return mod.post_combine(p["x"], h_res, h_post, u * 0.5)


def fused_module(module_file=None):
    """The fused mHC module: the checkout's, or ``module_file`` (another build of
    hyper_connection_fused.py, e.g. the one before a patch, to time both on one machine)."""
    if not module_file:
        from megatron.core.transformer import hyper_connection_fused

        return hyper_connection_fused
    import importlib.util

    spec = importlib.util.spec_from_file_location("mhc_fused_trial", module_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    print(f"module: {module_file}")
    return module


def make_inputs(T, n, h, seed=0):
    """One sublayer's leaves (streams, mapping weight and bias, the three alphas; bf16, requiring
    grad) and an output gradient, at ``T`` tokens, ``n`` streams, hidden ``h``, on CUDA."""
    C = n * n + 2 * n
    g = torch.Generator(device="cuda").manual_seed(seed)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    p = dict(
        x=torch.randn(T, n * h, generator=g, **bf), w=torch.randn(C, n * h, generator=g, **bf) * 0.02,
        b=torch.randn(C, generator=g, **bf), a_pre=torch.full((1,), 0.5, **bf),
        a_post=torch.full((1,), 0.5, **bf), a_res=torch.full((1,), 0.5, **bf),
    )  # fmt: skip
    return {k: v.requires_grad_(True) for k, v in p.items()}, torch.randn(T, n * h, generator=g, **bf)


def gpu_ms(fn, calls=20):
    """GPU time per call of ``fn`` queued back to back (launch gaps hidden when GPU-bound)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def sweep(fused, p, gout, n, iters):
    """Launch shapes of the fused kernels, each kernel timed alone (GPU time, back to back)."""
    import triton

    x, w = p["x"].detach(), p["w"].detach()
    T, D = x.shape
    h, C = D // n, w.shape[0]
    f32 = dict(device=x.device, dtype=torch.float32)
    saved = {k: getattr(fused, k) for k in ("_PROJ_BT", "_PROJ_BK", "_PROJ_WARPS", "_PROJ_STAGES")}
    for cfg in [(64, 128, 8, 3), (64, 128, 8, 4), (64, 256, 8, 3), (128, 128, 8, 3)]:
        fused._PROJ_BT, fused._PROJ_BK, fused._PROJ_WARPS, fused._PROJ_STAGES = cfg
        print(f"sweep proj fwd BT,BK,warps,stages={cfg}: {gpu_ms(lambda: fused._proj_forward(x, w, 1e-5)) * 1e3:7.1f} us")
    for k, v in saved.items():
        setattr(fused, k, v)
    gu = torch.randn(T, h, device=x.device, dtype=x.dtype)
    gxp = torch.randn_like(x)
    gx = torch.empty_like(x)
    hp, gz = torch.rand(T, n, **f32), torch.randn(T, C, **f32) * 1e-2
    rstd, coef = torch.rand(T, **f32), torch.rand(T, **f32) * 1e-3
    for bt, bh, warps in [(32, 128, 4), (16, 128, 4), (64, 128, 4), (32, 64, 4), (32, 256, 8), (64, 64, 4)]:
        def run():
            fused._in_bwd_dx_kernel[(n, triton.cdiv(h, bh), triton.cdiv(T, bt))](
                x, w, gu, hp, gz, rstd, coef, gxp, gx, T, h, C, N=n, BT=bt, BH=bh, BC=32,
                num_warps=warps, ADD_GX=True, PREC="tf32",
            )  # fmt: skip

        print(f"sweep input bwd dx BT,BH,warps={(bt, bh, warps)}: {gpu_ms(run) * 1e3:7.1f} us")
    saved = (fused._GW_BT, fused._GW_BK, fused._GW_TOKENS)
    for cfg in [(64, 128, 1024), (64, 128, 2048), (32, 128, 1024), (64, 64, 1024)]:
        fused._GW_BT, fused._GW_BK, fused._GW_TOKENS = cfg
        ms = gpu_ms(lambda: fused._weight_grad(x, gz, rstd, C, "tf32"))
        print(f"sweep input bwd dW BT,BK,tokens={cfg}: {ms * 1e3:7.1f} us (with the sum)")
    fused._GW_BT, fused._GW_BK, fused._GW_TOKENS = saved
    g_pre = torch.empty(T, n, **f32)
    for bt, bh, warps in [(4, 256, 4), (2, 256, 4), (8, 128, 4), (1, 1024, 4), (4, 512, 8), (16, 64, 4)]:
        def run():
            fused._pre_dh_kernel[(triton.cdiv(T, bt),)](x, gu, g_pre, T, h, N=n, NP=n, BT=bt, BH=bh, num_warps=warps)

        print(f"sweep pre dH BT,BH,warps={(bt, bh, warps)}: {gpu_ms(run) * 1e3:7.1f} us")
    h_res = torch.softmax(torch.randn(T, n, n, **f32), -1)
    h_post = torch.rand(T, n, **f32)

    class Ctx:
        saved_tensors = (x, h_res, h_post, gu)

    saved = (fused._STREAM_BT, fused._STREAM_BH)
    for bt, bh in [(4, 256), (2, 256), (8, 128), (2, 512), (1, 1024), (8, 256), (16, 64)]:
        fused._STREAM_BT, fused._STREAM_BH = bt, bh
        with torch.no_grad():
            fwd = gpu_ms(lambda: fused.post_combine(x, h_res, h_post, gu))
        bwd = gpu_ms(lambda: fused._PostCombine.backward(Ctx(), gxp))
        print(f"sweep post BT,BH={(bt, bh)}: fwd {fwd * 1e3:7.1f} us  bwd {bwd * 1e3:7.1f} us")
    fused._STREAM_BT, fused._STREAM_BH = saved


def cpu_ms(fn, calls=20):
    """Host time to issue one call of ``fn`` (no synchronisation; the queue does not fill)."""
    import time

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e3 / calls


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
    ap.add_argument("--impls", nargs="*", default=["native", "fused-split", "fused"],
                    choices=["native", "fused-split", "fused"])  # fmt: skip
    ap.add_argument("--sweep", action="store_true", help="time launch shapes of the fused kernels")
    ap.add_argument("--profile", action="store_true", help="print a kernel-level torch.profiler table of fused fwd+bwd")
    ap.add_argument("--module-file", help="time this copy of hyper_connection_fused.py as 'fused' (e.g. before a patch)")
    a = ap.parse_args()
    from megatron.core.transformer import hyper_connection as native

    fused = fused_module(a.module_file)

    T, n, h = a.tokens, a.streams, a.hidden
    p, gout = make_inputs(T, n, h)
    stream_bytes = T * n * h * 2
    # fused minimum: fwd reads x three times, writes u and x'; bwd reads x, g, y and writes dx
    # (three times, summed by autograd) and dy -- counted in whole [T, n*h] / [T, h] passes.
    fwd_bytes = 3 * stream_bytes + stream_bytes + 2 * T * h * 2
    print(f"tokens {T}, streams {n}, hidden {h}, bf16; one [T, n*h] pass = {stream_bytes / 2**20:.0f} MiB")
    for name in a.impls:
        mod, split = (native, False) if name == "native" else (fused, name == "fused-split")

        def fwd():
            return sublayer(mod, p, n, a.iters, split)

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
        gpu = gpu_ms(fwd_bwd)
        cpu = cpu_ms(fwd_bwd, 10)
        print(f"{name:11} fwd {f[0]:7.3f} ms ({f[1]:.3f}-{f[2]:.3f})  fwd+bwd {fb[0]:7.3f} ms "
              f"({fb[1]:.3f}-{fb[2]:.3f})  fwd+bwd queued {gpu:6.3f} ms, host {cpu:6.3f} ms  extra peak {peak:8.1f} MiB  "
              f"fwd GB/s at the fused minimum {fwd_bytes / f[0] / 1e6:7.0f}")  # fmt: skip

    if a.sweep:
        sweep(fused, p, gout, n, a.iters)
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        def fused_step():
            out = sublayer(fused, p, n, a.iters)
            torch.autograd.backward(out, gout)

        fused_step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fused_step()
            torch.cuda.synchronize()
        print("fused fwd+bwd, 10 steps, CUDA kernels:")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=60))


if __name__ == "__main__":
    main()
