"""Benchmark (not a test): the host side of one fused mHC sublayer (``mhc_input`` then
``post_combine``, forward + backward), on CUDA.

Why: with TE specs the model step is partly host-bound, so what the fused path costs the host
per sublayer counts as much as its kernels. At a tiny token count the GPU finishes each kernel
before the next one is issued, so wall time per call is host time; the same at the bench shape
shows whether the host ever waits for the GPU (a hidden synchronisation would make it equal the
GPU time). ``--sync-check`` runs one call under ``torch.cuda.set_sync_debug_mode("error")`` (a
prototype in torch: it does not catch every synchronising call);
``--cprofile`` prints where the host time goes, by Python function.

    python bench/experiments/mhc_host_overhead.py --tokens 64 --cprofile
"""

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.mhc_kernels import cpu_ms, fused_module, make_inputs, sublayer  # noqa: E402


def host_us(fn, calls):
    """Host time per call, no synchronisation inside the loop (microseconds)."""
    return cpu_ms(fn, calls) * 1e3


def pieces(fused, p, n, T, h, calls):
    """Host cost of the building blocks: one Triton launch, one allocation, one partial sum."""
    import triton

    x = p["x"].detach()
    hp = torch.rand(T, n, device="cuda")
    u = torch.empty(T, h, device="cuda", dtype=x.dtype)
    part = torch.rand(8, T, n * n, device="cuda")
    np_, bt, bh, hb = fused._stream_blocks(n, h)
    grid = (triton.cdiv(T, bt), hb)

    def launch():
        fused._pre_fwd_kernel[grid](x, hp, u, T, h, N=n, NP=np_, BT=bt, BH=bh)

    for name, fn in [
        ("one Triton launch (_pre_fwd_kernel, 8 arguments)", launch),
        ("torch.empty", lambda: torch.empty(T, h, device="cuda", dtype=x.dtype)),
        ("partial sum .sum(0)", lambda: part.sum(0)),
        ("_PreAggregate.apply (no grad)", lambda: fused._PreAggregate.apply(x, hp)),
    ]:
        with torch.no_grad():
            print(f"  {name:52s} {host_us(fn, calls):7.1f} us")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="*", default=[64, 16384])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--sync-check", action="store_true")
    ap.add_argument("--cprofile", action="store_true", help="profile the host at the first token count")
    ap.add_argument("--module-file", help="time this copy of hyper_connection_fused.py instead (a trial build)")
    a = ap.parse_args()
    fused = fused_module(a.module_file)

    n = a.streams
    for i, T in enumerate(a.tokens):
        p, gout = make_inputs(T, n, a.hidden)

        def fwd():
            return sublayer(fused, p, n, a.iters)

        def fwd_bwd():
            torch.autograd.backward(fwd(), gout)

        if a.sync_check and i == 0:
            fwd_bwd()
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                fwd_bwd()
                print("sync check: one fused sublayer forward + backward issued no synchronising call that the "
                      "(prototype) sync debug mode detects")
            finally:
                torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
        with torch.no_grad():
            f_host = host_us(fwd, a.calls)
        fb_host = host_us(fwd_bwd, a.calls)
        print(f"tokens {T:6d}: forward (no grad) host {f_host:7.1f} us/call; forward + backward host {fb_host:7.1f} us/call")
        if a.cprofile and i == 0:
            pieces(fused, p, n, T, a.hidden, a.calls)
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as tprof:
                for _ in range(a.calls):
                    fwd_bwd()
                torch.cuda.synchronize()
            print(f"torch.profiler (all threads, the autograd engine's included), {a.calls} calls:")
            print(tprof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(a.calls):
                fwd_bwd()
            torch.cuda.synchronize()
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
            print(f"cProfile, {a.calls} calls of forward + backward at tokens {T} (tottime):")
            print(out.getvalue())


if __name__ == "__main__":
    main()
