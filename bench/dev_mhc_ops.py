"""Upstream dev's two native-fallback mHC ops against the fork's Triton kernels (not a test).

On a host without a working cuTile (no ``tileiras``, as on our H200s) dev's ``use_fused_mhc``
path runs ``proj_rms_compute_h`` and the aggregation backward in native torch. The upstream-dev
line's ``mhc-fused-kernels`` patch runs the fork's Triton kernels there instead
(``megatron/core/transformer/hyper_connection_fused.py``: ``h_aggregate_backward`` and
``proj_rms_compute_h``; a tree without the latter prints no fork row for that op). For each op
this prints the time per call (forward alone where the op has one, and forward + backward) on
both paths, and the largest difference of any output or gradient from a float64 run of dev's
native function, beside dev's native path's own difference (the bound the fork's must meet).
For ``proj_rms_compute_h`` the row ``dev dispatch`` is dev's public ``fused_proj_rms_compute_h``
(what ``use_fused_mhc`` calls; on the line it should time like ``fork triton``), and a line per
path gives the difference of each output and gradient. ``ideal ms`` is the op's unavoidable HBM
traffic at --hbm-gbs (forward: read x once; backward: read x and write dx once).

    python bench/dev_mhc_ops.py --root <source root of the upstream-dev line's megatron/>
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.mhc_kernels import gpu_ms  # noqa: E402


def _err(a, ref):
    return (a.double() - ref).abs().max().item()


PROJ_NAMES = ("h_pre", "h_post", "h_res", "dx", "dW", "da_pre", "da_post", "da_res", "dbias")


def proj_case(dk, fk, T, n, C, reps):
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(T, n * C, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n * n + 2 * n, n * C, device="cuda", generator=g) * 0.02).float()
    alphas = [torch.full((1,), v, device="cuda") for v in (0.5, 0.4, 0.3)]
    bias = torch.randn(n * n + 2 * n, device="cuda", generator=g) * 0.1
    grads = [torch.randn(T, k, device="cuda", generator=g) for k in (n, n, n * n)]

    def leaves_of(dtype=None):
        return [t.detach().to(dtype or t.dtype).requires_grad_(True) for t in (x, w, *alphas, bias)]

    def run(fn, dtype=None):
        leaves = leaves_of(dtype)
        outs = fn(leaves[0], leaves[1], *leaves[2:5], leaves[5], n, 1e-6, 1e-6)[:3]
        torch.autograd.backward(outs, [gr.to(outs[0].dtype) for gr in grads])
        return [o.detach() for o in outs] + [leaf.grad for leaf in leaves]

    def forward(fn):
        leaves = leaves_of()
        return lambda: fn(leaves[0], leaves[1], *leaves[2:5], leaves[5], n, 1e-6, 1e-6)

    ref = [t.double() for t in run(dk._torch_proj_rms_compute_h, torch.float64)]
    rows = {}
    paths = [("dev native", dk._torch_proj_rms_compute_h)]
    if hasattr(fk, "proj_rms_compute_h"):
        paths += [("fork triton", fk.proj_rms_compute_h), ("dev dispatch", dk.fused_proj_rms_compute_h)]
    for name, fn in paths:
        got = run(fn)
        errs = [_err(a, r) for a, r in zip(got, ref)]
        rows[name] = (gpu_ms(forward(fn), reps), gpu_ms(lambda: run(fn), reps), max(errs), errs)
    return rows


def aggregate_case(dk, fk, T, n, C, reps):
    import torch

    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(T, 1, n, C, device="cuda", generator=g).bfloat16()
    h = torch.rand(T, 1, n, device="cuda", generator=g).bfloat16()
    go = torch.randn(T, 1, C, device="cuda", generator=g).bfloat16()
    ref = dk._torch_h_aggregate_bwd(go.double(), x.double(), h.double())
    rows = {}
    for name, fn in (("dev native", dk._torch_h_aggregate_bwd), ("fork triton", fk.h_aggregate_backward)):
        got = fn(go, x, h)
        rows[name] = (None, gpu_ms(lambda: fn(go, x, h), reps), max(_err(a, r) for a, r in zip(got, ref)), None)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, help="source root whose megatron/ has the fork kernels on dev")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--hidden", type=int, nargs="+", default=[2048, 4096])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--hbm-gbs", type=float, default=4800.0, help="HBM bandwidth for 'ideal ms' (H200: 4800)")
    p.add_argument(
        "--proj-blocks", type=int, nargs=6, metavar=("FWD_BT", "FWD_BK", "FWD_WARPS", "BWD_BT", "BWD_BK", "BWD_WARPS"),
        help="time the projection kernels with these block sizes (powers of two >= 16) and warps instead of the module's",
    )  # fmt: skip
    args = p.parse_args()
    sys.path.insert(0, args.root)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("dev_mhc_ops: needs a CUDA device (the kernels are Triton)")
    from megatron.core.transformer import hyper_connection_fused as fk
    from megatron.core.fusions import fused_mhc_kernels as dk

    if args.proj_blocks:
        sizes = args.proj_blocks[:2] + args.proj_blocks[3:5]
        if any(v <= 0 or v & (v - 1) for v in args.proj_blocks) or min(sizes) < 16:
            raise SystemExit(
                f"dev_mhc_ops: --proj-blocks takes powers of two, block sizes >= 16 (tl.dot), got {args.proj_blocks}"
            )
        names = ("_PROJ_FWD_BT", "_PROJ_FWD_BK", "_PROJ_FWD_WARPS", "_PROJ_BWD_BT", "_PROJ_BWD_BK", "_PROJ_BWD_WARPS")
        for name, value in zip(names, args.proj_blocks):
            if not hasattr(fk, name):
                raise SystemExit(f"dev_mhc_ops: --proj-blocks: {args.root} has no {name} (no projection kernel)")
            setattr(fk, name, value)
    blocks = [getattr(fk, f"_PROJ_{k}", None) for k in ("FWD_BT", "FWD_BK", "FWD_WARPS", "BWD_BT", "BWD_BK", "BWD_WARPS")]
    print(f"backends: {dk._mhc_backend_selection()}; projection blocks fwd/bwd (BT, BK, warps): {blocks}")
    head = f"{'op':<22}{'hidden':>7}{'path':>14}{'fwd ms':>9}{'fwd+bwd ms':>12}{'ideal ms':>10}"
    print(head + f"{'max |err| vs fp64':>20}")
    for C in args.hidden:
        x_bytes = args.tokens * args.streams * C * 2  # bf16 streams
        ideal = {"proj_rms_compute_h": 3 * x_bytes, "h_aggregate backward": 2 * x_bytes + x_bytes // args.streams * 1}
        for op, case in (("proj_rms_compute_h", proj_case), ("h_aggregate backward", aggregate_case)):
            ideal_ms = ideal[op] / (args.hbm_gbs * 1e9) * 1e3
            for path, (fwd, ms, err, errs) in case(dk, fk, args.tokens, args.streams, C, args.reps).items():
                fwd_s = "-" if fwd is None else f"{fwd:.3f}"
                print(f"{op:<22}{C:>7}{path:>14}{fwd_s:>9}{ms:>12.3f}{ideal_ms:>10.3f}{err:>20.3e}")
                if errs is not None:
                    print("    " + ", ".join(f"{k} {e:.2e}" for k, e in zip(PROJ_NAMES, errs)))


if __name__ == "__main__":
    main()
