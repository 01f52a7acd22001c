"""Registers, spills, shared memory and MMA kinds of the upstream-dev line's projection kernels,
compiled for an H100/H200 (sm_90) on any machine: no GPU needed (not a test).

Triton compiles ahead of time for a named target with the ptxas and cuobjdump its wheel carries,
so a CPU-only host can see what a tile choice costs before a GPU session times it: a kernel that
spills registers to local memory (``stack`` > 0) or whose products fell back from Hopper's warpgroup
MMA (``wgmma``) to the older ``mma.sync`` is suspect. These figures are what the compiler emits,
not speed; ``bench/proj_block_sweep.py`` on a GPU decides.

    python bench/triton_resources.py --root LINE_TREE [--candidates] [--streams 4]

Default: the module's own tile constants. ``--candidates``: every candidate proj_block_sweep
times, too.
"""

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# pointer and scalar arguments of each kernel, with the dtypes the line's bf16 training uses
_X, _F32, _BF16, _I32 = "*bf16", "*fp32", "*bf16", "i32"
KERNELS = {
    "forward": ("_proj_fwd_kernel", dict(x_ptr=_X, w_ptr=_F32, part_ptr=_F32, ss_ptr=_F32, T=_I32, K=_I32, steps_per_split=_I32)),
    "fused backward": ("_proj_bwd_kernel", dict(x_ptr=_X, w_ptr=_F32, p_ptr=_F32, c_ptr=_F32, dx_ptr=_X, dwp_ptr=_F32, T=_I32, K=_I32, tokens_per_split=_I32)),
    "split dx": ("_proj_dx_kernel", dict(x_ptr=_X, w_ptr=_F32, pp_ptr=_BF16, c_ptr=_F32, dx_ptr=_X, T=_I32, K=_I32, chunk=_I32)),
    "split dW": ("_proj_dw_kernel", dict(x_ptr=_X, pp_ptr=_BF16, dwp_ptr=_F32, T=_I32, K=_I32, tokens_per_split=_I32)),
}


def cuobjdump_path() -> str:
    """The cuobjdump Triton itself uses (its ``knobs``: the wheel's copy, or TRITON_CUOBJDUMP_PATH)."""
    import triton

    try:
        return triton.knobs.nvidia.cuobjdump.path
    except Exception as missing:  # a Triton without NVIDIA tools, or without knobs (older than 3.4)
        sys.exit(f"triton_resources: Triton {triton.__version__} gives no cuobjdump ({missing})")


def resources(fn, signature, constexprs, num_warps, num_stages=3, arch=90):
    """Compile ``fn`` for sm_<arch> and return its shared memory (bytes), registers, stack
    (spilled bytes per thread) and the number of warpgroup and mma.sync instructions."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = dict(signature, **{name: "constexpr" for name in constexprs})
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": num_warps, "num_stages": num_stages})  # fmt: skip
    cubin = Path(os.environ.get("TMPDIR", "/tmp")) / f"triton_resources_{os.getpid()}.cubin"
    try:
        cubin.write_bytes(kernel.asm["cubin"])
        dump = subprocess.run([cuobjdump_path(), "-res-usage", str(cubin)],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
    finally:
        cubin.unlink(missing_ok=True)
    usage = re.search(r"REG:(\d+) STACK:(\d+)", dump)
    if usage is None:
        raise RuntimeError(f"cuobjdump printed no register usage for {fn.__name__}: {dump[:200]}")
    ptx = kernel.asm["ptx"]
    return {
        "shared": kernel.metadata.shared,
        "registers": int(usage.group(1)),
        "stack": int(usage.group(2)),
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "mma.sync": len(re.findall(r"\bmma\.sync", ptx)),
    }


def cases(fk, n, candidates):
    """(label, kernel role, constexprs, warps) to compile: the module's constants, and with
    ``candidates`` every tile choice bench/proj_block_sweep.py times."""
    NW = fk._mapping_width(n)
    NP = fk._padded_width(NW)
    fwd = [(fk._PROJ_FWD_BT, fk._PROJ_FWD_BK, fk._PROJ_FWD_WARPS)]
    bwd = [(fk._PROJ_BWD_BT, fk._PROJ_BWD_BK, fk._PROJ_BWD_WARPS)]
    split = []
    if hasattr(fk, "_proj_dx_kernel"):  # trees before the split schedule have only the fused one
        split = [((fk._PROJ_DX_BT, fk._PROJ_DX_BK, fk._PROJ_DX_CHUNK, fk._PROJ_DX_WARPS),
                  (fk._PROJ_DW_BK, fk._PROJ_DW_BT, fk._PROJ_DW_WARPS))]  # fmt: skip
    if candidates:
        from bench import proj_block_sweep

        fwd += [c for c in proj_block_sweep.CANDIDATES if c not in fwd]
        bwd += [c for c in proj_block_sweep.CANDIDATES if c not in bwd]
        if split:
            split += [c for c in proj_block_sweep.SPLIT_CANDIDATES if c not in split]
    for BT, BK, W in fwd:
        yield f"(BT {BT}, BK {BK}, {W} warps)", "forward", dict(NW=NW, NP=NP, BT=BT, BK=BK, X_PARTS=1), W
    for BT, BK, W in bwd:
        consts = dict(NW=NW, NP=NP, BT=BT, BK=BK, X_PARTS=1, DX_LEVELS=2)
        yield f"(BT {BT}, BK {BK}, {W} warps)", "fused backward", consts, W
    for (dx_bt, dx_bk, _, dx_w), (dw_bk, dw_bt, dw_w) in split:
        consts = dict(NW=NW, NP=NP, BT=dx_bt, BK=dx_bk, DX_LEVELS=2)
        yield f"(BT {dx_bt}, BK {dx_bk}, {dx_w} warps)", "split dx", consts, dx_w
        yield f"(BK {dw_bk}, BT {dw_bt}, {dw_w} warps)", "split dW", dict(NP=NP, BT=dw_bt, BK=dw_bk, X_PARTS=1), dw_w


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="source root of the upstream-dev line's megatron/")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--candidates", action="store_true", help="also every candidate of proj_block_sweep")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(args.root).resolve()))
    from megatron.core.transformer import hyper_connection_fused as fk

    if not hasattr(fk, "_proj_bwd_kernel"):
        sys.exit(f"triton_resources: {fk.__file__} has no projection kernels "
                 "(not the upstream-dev line's tree)")  # fmt: skip
    import triton

    print(f"sm_90 by Triton {triton.__version__}, {args.streams} streams, bf16 activations; module {fk.__file__}")
    print(f"{'kernel':<15} {'tiles':<26} {'smem B':>7} {'regs':>5} {'stack':>6} {'wgmma':>6} {'mma.sync':>9}")
    seen = set()
    for label, role, consts, warps in cases(fk, args.streams, args.candidates):
        if (role, label) in seen:
            continue
        seen.add((role, label))
        name, signature = KERNELS[role]
        r = resources(getattr(fk, name), signature, consts, warps)
        print(f"{role:<15} {label:<26} {r['shared']:>7} {r['registers']:>5} {r['stack']:>6} "
              f"{r['wgmma']:>6} {r['mma.sync']:>9}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
