"""Block sizes of the upstream-dev line's projection kernels, timed on a GPU (not a test).

The line's ``hyper_connection_fused.proj_rms_compute_h`` (dev's projection + RMS + compute-H, in
Triton) takes its tile shapes from module constants: ``_PROJ_FWD_{BT,BK,WARPS}`` for the forward
and ``_PROJ_BWD_{BT,BK,WARPS}`` for the backward's fused schedule; ``_PROJ_BWD_SCHEDULE`` picks
between that schedule and the split one (a dx pass and a dW pass, tiles ``_PROJ_DX_*`` and
``_PROJ_DW_*``). This times the forward alone and forward + backward for each candidate at one
shape, then the split schedule's candidates, and prints the fastest forward and the fastest
backward (schedule and tiles), which is how the constants in the line's resolution are picked (the
sweep's output is kept in bench/results/dev-line/). Only the schedule and tile shapes change
between rows, not the math.

    python bench/proj_block_sweep.py --root LINE_TREE [--tokens 16384] [--hidden 4096] [--streams 4]
"""

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.mhc_kernels import gpu_ms  # noqa: E402

NAMES = ("BT", "BK", "WARPS")
CANDIDATES = [(64, 128, 8), (128, 64, 4), (64, 256, 8), (128, 128, 8), (32, 256, 4), (64, 64, 4),
              (128, 64, 8), (64, 64, 8)]
# the split schedule: (dx tokens, dx channels per step, dx channels per program, dx warps),
# (dW channels, dW tokens per step, dW warps)
SPLIT_NAMES = (("DX", ("BT", "BK", "CHUNK", "WARPS")), ("DW", ("BK", "BT", "WARPS")))
SPLIT_CANDIDATES = [  # none spills registers on sm_90 (bench/triton_resources.py --candidates)
    ((64, 64, 2048, 8), (256, 64, 8)),
    ((128, 64, 2048, 8), (256, 64, 8)),
    ((64, 64, 1024, 4), (128, 64, 8)),
    ((64, 64, 4096, 8), (128, 128, 8)),
    ((128, 64, 4096, 8), (256, 32, 8)),
    ((64, 64, 2048, 8), (128, 64, 4)),
]


def set_tiles(fk, fwd, bwd):
    """Set the module's tile constants: ``bwd`` is the fused schedule's (BT, BK, WARPS) or the
    split schedule's ((DX tiles), (DW tiles)); the schedule follows from its form."""
    for name, value in zip(NAMES, fwd):
        setattr(fk, "_PROJ_FWD_" + name, value)
    if isinstance(bwd[0], tuple):
        fk._PROJ_BWD_SCHEDULE = "split"
        for (prefix, names), values in zip(SPLIT_NAMES, bwd):
            for name, value in zip(names, values):
                setattr(fk, f"_PROJ_{prefix}_{name}", value)
    else:
        fk._PROJ_BWD_SCHEDULE = "fused"
        for name, value in zip(NAMES, bwd):
            setattr(fk, "_PROJ_BWD_" + name, value)


def gradients(fk, x, w, params, n):
    """dx and dW of one forward + backward with the module's current constants."""
    for leaf in (x, w, *params):
        leaf.grad = None
    outs = fk.proj_rms_compute_h(x, w, *params, n)
    sum(o.float().sum() for o in outs).backward()
    return x.grad.float().clone(), w.grad.clone()


# what two correct schedules may differ by, relative to each tensor's largest value: dx is
# rounded to bf16 (one rounding, 2^-8, may land either side), dW is fp32 sums in another order
DX_SLACK, DW_SLACK = 2.0**-7, 1e-4


def differs(got, ref):
    """got's (dx, dW) differences from ref's, each relative to the tensor's largest value, as a
    fraction of what two correct schedules may differ by (> 1: other math)."""
    rel = [((a - b).abs().max() / (b.abs().max() + 1e-30)).item() for a, b in zip(got, ref)]
    return max(rel[0] / DX_SLACK, rel[1] / DW_SLACK)


def time_config(fk, fwd, bwd, x, w, params, n, calls, ref=None):
    """(forward ms, forward + backward ms, relative difference of dx and dW from ``ref``) of one
    forward tile shape and one backward choice; None where it failed or ran but differs."""
    set_tiles(fk, fwd, bwd)

    def forward():
        return fk.proj_rms_compute_h(x, w, *params, n)

    def step():
        outs = forward()
        sum(o.float().sum() for o in outs).backward()

    try:
        diff = 0.0 if ref is None else differs(gradients(fk, x, w, params, n), ref)
        if diff > 1.0:
            print(f"{str(bwd):>46} gives other gradients ({diff:.1f}x the slack): left out")
            return None
        return gpu_ms(forward, calls), gpu_ms(step, calls), diff
    except Exception as error:  # a candidate that does not compile or launch here is left out
        print(f"{str(bwd):>46} failed: {type(error).__name__}: {str(error).splitlines()[0][:120]}")
        return None


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
    if not hasattr(fk, "_PROJ_BWD_SCHEDULE"):
        sys.exit(f"proj_block_sweep: {fk.__file__} predates the backward schedules; rebuild the line's tree")
    default = tuple(getattr(fk, f"_PROJ_FWD_{k}") for k in NAMES), tuple(getattr(fk, f"_PROJ_BWD_{k}") for k in NAMES)
    print(f"tokens {args.tokens}, K {K}, streams {n}; module default fwd {default[0]} bwd "
          f"{fk._PROJ_BWD_SCHEDULE} {default[1]}")  # fmt: skip
    print(f"{'BT, BK, warps':>16} {'fwd ms':>8} {'fwd+bwd ms':>11} {'bwd ms':>8}")
    ref = gradients(fk, x, w, params, n)  # the module's defaults: every candidate is checked against them

    def sweep(pairs, show):
        """Time (forward tiles, backward choice) pairs; rows of (backward choice, fwd ms, bwd ms)."""
        rows = []
        for fwd, bwd in pairs:
            timed = time_config(fk, fwd, bwd, x, w, params, n, args.calls, ref)
            if timed:
                fwd_ms, step_ms, diff = timed
                rows.append((bwd, fwd_ms, step_ms - fwd_ms))
                print(show(bwd, fwd_ms, step_ms, diff))
        return rows

    rows = sweep([(cfg, cfg) for cfg in CANDIDATES],
                 lambda cfg, f, s, _: f"{str(cfg):>16} {f:8.3f} {s:11.3f} {s - f:8.3f}")  # fmt: skip
    if not rows:
        sys.exit("proj_block_sweep: no candidate of the fused schedule ran")
    best_fwd = min(rows, key=lambda r: r[1])[0]
    print(f"split schedule, forward {best_fwd}:")
    print(f"{'dx (BT, BK, chunk, warps), dW (BK, BT, warps)':>46} {'bwd ms':>8} {'diff/slack':>10}")
    rows += sweep([(best_fwd, cfg) for cfg in SPLIT_CANDIDATES],
                  lambda cfg, f, s, d: f"{str(cfg):>46} {s - f:8.3f} {d:10.2f}")  # fmt: skip
    best_bwd = min(rows, key=lambda r: r[2])[0]
    timed = time_config(fk, best_fwd, best_bwd, x, w, params, n, args.calls)
    if timed is None:
        sys.exit(f"proj_block_sweep: the chosen pair fwd {best_fwd} bwd {best_bwd} did not run again")
    fwd_ms, step_ms, _ = timed
    schedule = fk._PROJ_BWD_SCHEDULE
    print(f"best: fwd {best_fwd} bwd {schedule} {best_bwd}: fwd {fwd_ms:.3f} ms, fwd+bwd {step_ms:.3f} ms")
    flat = itertools.chain(best_fwd, *(best_bwd if schedule == "split" else (best_bwd,)))
    print(f"BEST {schedule} " + " ".join(str(v) for v in flat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
