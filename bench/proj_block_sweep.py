"""Block sizes of the upstream-dev line's projection kernels, timed on a GPU (not a test).

The line's ``hyper_connection_fused.proj_rms_compute_h`` (dev's projection + RMS + compute-H, in
Triton) takes its tile shapes from module constants: ``_PROJ_FWD_{BT,BK,WARPS}`` for the forward
and ``_PROJ_BWD_{BT,BK,WARPS}`` for the backward. This times the forward alone and forward +
backward for each candidate at one shape and prints the fastest forward and backward choice, which
is how the constants in the line's resolution were picked (the sweep's output is kept in
bench/results/dev-line/). Only the tile shapes change between rows, not the math.

    python bench/proj_block_sweep.py --root LINE_TREE [--tokens 16384] [--hidden 4096] [--streams 4]
"""

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.mhc_kernels import gpu_ms  # noqa: E402

NAMES = ("BT", "BK", "WARPS")
CANDIDATES = [(64, 128, 8), (128, 64, 4), (64, 256, 8), (128, 128, 8), (32, 256, 4), (64, 64, 4)]


def time_config(fk, fwd, bwd, x, w, params, n, calls):
    """(forward ms, forward + backward ms) of one pair of tile shapes."""
    for prefix, values in (("_PROJ_FWD_", fwd), ("_PROJ_BWD_", bwd)):
        for name, value in zip(NAMES, values):
            setattr(fk, prefix + name, value)

    def forward():
        return fk.proj_rms_compute_h(x, w, *params, n)

    def step():
        outs = forward()
        sum(o.float().sum() for o in outs).backward()

    return gpu_ms(forward, calls), gpu_ms(step, calls)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="source root of the upstream-dev line's megatron/")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(args.root).resolve()))
    import torch

    if not torch.cuda.is_available():
        sys.exit("proj_block_sweep: needs a CUDA device")
    from megatron.core.transformer import hyper_connection_fused as fk

    if not hasattr(fk, "proj_rms_compute_h"):
        sys.exit(f"proj_block_sweep: {fk.__file__} has no proj_rms_compute_h (not the upstream-dev line)")
    n, K = args.streams, args.streams * args.hidden
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(args.tokens, K, device="cuda", generator=g).bfloat16().requires_grad_()
    w = (torch.randn(n * n + 2 * n, K, device="cuda", generator=g) * 0.02).requires_grad_()
    params = [torch.full((1,), v, device="cuda", requires_grad=True) for v in (0.5, 0.7, 0.9)]
    params.append(torch.zeros(n * n + 2 * n, device="cuda", requires_grad=True))
    default = tuple(getattr(fk, f"_PROJ_FWD_{k}") for k in NAMES), tuple(getattr(fk, f"_PROJ_BWD_{k}") for k in NAMES)
    print(f"tokens {args.tokens}, K {K}, streams {n}; module default fwd {default[0]} bwd {default[1]}")
    print(f"{'BT, BK, warps':>16} {'fwd ms':>8} {'fwd+bwd ms':>11} {'bwd ms':>8}")
    rows = []
    for cfg in CANDIDATES:
        fwd_ms, step_ms = time_config(fk, cfg, cfg, x, w, params, n, args.calls)
        rows.append((cfg, fwd_ms, step_ms - fwd_ms))
        print(f"{str(cfg):>16} {fwd_ms:8.3f} {step_ms:11.3f} {step_ms - fwd_ms:8.3f}")
    best_fwd = min(rows, key=lambda r: r[1])[0]
    best_bwd = min(rows, key=lambda r: r[2])[0]
    fwd_ms, step_ms = time_config(fk, best_fwd, best_bwd, x, w, params, n, args.calls)
    print(f"best: fwd {best_fwd} bwd {best_bwd}: fwd {fwd_ms:.3f} ms, fwd+bwd {step_ms:.3f} ms")
    print("BEST " + " ".join(str(v) for v in itertools.chain(best_fwd, best_bwd)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
