"""Benchmark (not a test): a candidate replacement for the mHC input backward kernel, timed and
checked against the shipped one at the bench model's shape.

Why: at 16384 tokens the shipped ``_in_bwd_kernel`` (patch ``mhc-fused-kernels``) moves its 871 MB
at 1.7 TB/s, the one mHC kernel far from the memory floor (docs/benchmarks.md, "Launch shapes are
not the lever"). It writes ``dx`` and accumulates the mapping weight's gradient ``dW`` in the same
loop, two small tf32 GEMMs per 32-token tile. The candidate splits the two jobs: one program per
(stream, hidden block, token block) writes ``dx`` with a single small GEMM and no loop-carried
state, and a second kernel reduces ``dW`` over token ranges, reading the streams once more (268 MB
at 16384 tokens). It pays off if the pair beats the shipped kernel on the GPU; this script says
by how much, for every launch shape it tries, and checks both outputs against the shipped ones.

    python3 bench/mhc_in_bwd_candidates.py --tokens 16384 --streams 4 --hidden 2048     # on CUDA

On CPU (``TRITON_INTERPRET=1``) :func:`compare` runs both on a small shape; the test in
``tests/bench/test_mhc_in_bwd_candidates.py`` uses that to keep the candidate correct. The
interpreter multiplies bf16 dot inputs as raw bits, so the ``low`` dW variant (bf16 GEMM inputs)
is checked only on the GPU, where every dW shape's error is printed and a wrong one is not taken.
"""

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _dx_kernel(
    x_ptr, w_ptr, gu_ptr, hp_ptr, gz_ptr, rstd_ptr, coef_ptr, gxp_ptr, gx_ptr, T, H, C,
    N: tl.constexpr, BT: tl.constexpr, BH: tl.constexpr, BC: tl.constexpr,
    ADD_GX: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """dx_j = H_pre[j] du + rstd (dz @ W_j) - x_j coef (+ the combine's dx) for one tile; the
    stream index is the fastest grid axis, so the n programs of a tile share du and dz in L2."""
    jst = tl.program_id(0)
    hs = tl.program_id(1) * BH + tl.arange(0, BH)
    rows = tl.program_id(2) * BT + tl.arange(0, BT)
    D = N * H
    cols = tl.arange(0, BC)
    hmask, cmask, rmask = hs < H, cols < C, rows < T
    ks = jst * H + hs
    w = tl.load(w_ptr + cols[:, None] * D + ks[None, :], mask=cmask[:, None] & hmask[None, :], other=0.0)
    gz = tl.load(gz_ptr + rows[:, None] * C + cols[None, :], mask=rmask[:, None] & cmask[None, :], other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
    coef = tl.load(coef_ptr + rows, mask=rmask, other=0.0)
    hp = tl.load(hp_ptr + rows * N + jst, mask=rmask, other=0.0)
    m = rmask[:, None] & hmask[None, :]
    offs = rows[:, None].to(tl.int64) * D + ks[None, :]
    x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
    gu = tl.load(gu_ptr + rows[:, None].to(tl.int64) * H + hs[None, :], mask=m, other=0.0).to(tl.float32)
    gr = tl.dot(gz, w.to(tl.float32), input_precision=PREC)
    gx = hp[:, None] * gu + rstd[:, None] * gr - x * coef[:, None]
    if ADD_GX:
        gx += tl.load(gxp_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(gx_ptr + offs, gx.to(gx_ptr.dtype.element_ty), mask=m)


@triton.jit
def _dw_kernel(
    x_ptr, gz_ptr, rstd_ptr, gw_ptr, T, D, C, TS,
    BT: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr, LOW: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Partial dW[c, k] = sum over this program's token range of dz[t, c] rstd[t] x[t, k] (fp32
    accumulation; ``LOW``: the GEMM's inputs in the streams' dtype instead of tf32)."""
    ks = tl.program_id(0) * BK + tl.arange(0, BK)
    split = tl.program_id(1)
    cols = tl.arange(0, BC)
    kmask, cmask = ks < D, cols < C
    acc = tl.zeros((BC, BK), dtype=tl.float32)
    for t0 in range(split * TS, tl.minimum(split * TS + TS, T), BT):
        rows = t0 + tl.arange(0, BT)
        rmask = rows < T
        rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
        gzt = tl.load(gz_ptr + cols[:, None] + rows[None, :] * C, mask=cmask[:, None] & rmask[None, :], other=0.0)
        gzt = gzt * rstd[None, :]
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * D + ks[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        if LOW:
            acc += tl.dot(gzt.to(x.dtype), x)
        else:
            acc += tl.dot(gzt, x.to(tl.float32), input_precision=PREC)
    tl.store(gw_ptr + split * C * D + cols[:, None] * D + ks[None, :], acc, mask=cmask[:, None] & kmask[None, :])


def _np2_16(v):
    """The next power of two, at least 16: the shipped kernels' ``_np2(v, 16)`` (tile sizes of tl.dot)."""
    from megatron.core.transformer.hyper_connection_fused import _np2

    return _np2(v, 16)


def _prec(x):
    return "tf32" if x.element_size() == 2 else "tf32x3"


def shipped(fused, a, n, add_gx=True):
    """``(dx, dW)`` through the shipped kernel, launched as ``_MhcInput.backward`` launches it."""
    x, w = a["x"], a["w"]
    T, D = x.shape
    h, C = D // n, w.shape[0]
    bh = min(fused._IN_BH, fused._np2(h, 16))
    splits = triton.cdiv(T, fused._GW_TOKENS)
    gx = torch.empty_like(x)
    gw = torch.empty(splits, C, D, device=x.device, dtype=torch.float32)
    fused._in_bwd_kernel[(n, triton.cdiv(h, bh), splits)](
        x, w, a["gu"], a["hp"], a["gz"], a["rstd"], a["coef"], a["gxp"] if add_gx else x, gx, gw, T, h, C,
        fused._GW_TOKENS, N=n, BT=fused._IN_BT, BH=bh, BC=_np2_16(C), num_warps=fused._IN_WARPS, ADD_GX=add_gx,
        PREC=_prec(x),
    )  # fmt: skip
    return gx, gw.sum(0)


def candidate(a, n, dx_shape=(32, 128, 4), dw_shape=(64, 64, 1024, 4), low=False, add_gx=True):
    """``(dx, dW)`` through the candidate pair. ``dx_shape``: (BT, BH, warps); ``dw_shape``: (BT,
    BK, tokens per range, warps)."""
    x, w = a["x"], a["w"]
    T, D = x.shape
    h, C = D // n, w.shape[0]
    bt, bh, warps = dx_shape
    bh = min(bh, _np2_16(h))
    gx = torch.empty_like(x)
    _dx_kernel[(n, triton.cdiv(h, bh), triton.cdiv(T, bt))](
        x, w, a["gu"], a["hp"], a["gz"], a["rstd"], a["coef"], a["gxp"] if add_gx else x, gx, T, h, C,
        N=n, BT=bt, BH=bh, BC=_np2_16(C), ADD_GX=add_gx, PREC=_prec(x), num_warps=warps,
    )  # fmt: skip
    wbt, bk, ts, wwarps = dw_shape
    splits = triton.cdiv(T, ts)
    gw = torch.empty(splits, C, D, device=x.device, dtype=torch.float32)
    _dw_kernel[(triton.cdiv(D, bk), splits)](
        x, a["gz"], a["rstd"], gw, T, D, C, ts, BT=wbt, BK=bk, BC=_np2_16(C), LOW=low, PREC=_prec(x),
        num_warps=wwarps,
    )  # fmt: skip
    return gx, gw.sum(0)


def inputs(T, n, h, dtype, device, seed=0):
    """The tensors the input backward reads, with the scales they have in training."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    C = n * n + 2 * n

    def r(*shape, scale=1.0, dt=torch.float32):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dt)

    return dict(
        x=r(T, n * h, dt=dtype), w=r(C, n * h, scale=0.02, dt=dtype), gu=r(T, h, dt=dtype),
        gxp=r(T, n * h, dt=dtype), hp=torch.rand(T, n, generator=g).to(device),
        gz=r(T, C, scale=1e-2), rstd=torch.rand(T, generator=g).to(device) + 0.5,
        coef=torch.rand(T, generator=g).to(device) * 1e-3,
    )  # fmt: skip


def compare(T=64, n=4, h=32, dtype=torch.float32, device="cpu", **shapes):
    """Largest differences of the candidate's ``dx`` and ``dW`` from the shipped kernel's, relative
    to the largest magnitude of each (both kernels sum in fp32, in other orders)."""
    from megatron.core.transformer import hyper_connection_fused as fused

    a = inputs(T, n, h, dtype, device)
    out = {}
    for add_gx in (True, False):
        ref_dx, ref_dw = shipped(fused, a, n, add_gx)
        dx, dw = candidate(a, n, add_gx=add_gx, **shapes)
        out[add_gx] = (
            float((dx.float() - ref_dx.float()).abs().max() / ref_dx.float().abs().max()),
            float((dw - ref_dw).abs().max() / ref_dw.abs().max()),
        )
    return out


def main():
    from bench.mhc_kernels import gpu_ms
    from megatron.core.transformer import hyper_connection_fused as fused

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=2048)
    a_ = ap.parse_args()
    T, n, h = a_.tokens, a_.streams, a_.hidden
    a = inputs(T, n, h, torch.bfloat16, "cuda")
    moved = (3 * T * n * h + T * h) * 2  # x, the combine's dx and dx itself, du (bf16)
    base = gpu_ms(lambda: shipped(fused, a, n))
    print(f"tokens {T}, streams {n}, hidden {h}, bf16: shipped _in_bwd + dW sum {base * 1e3:7.1f} us "
          f"({moved / base / 1e9:.2f} TB/s on the dx pass's {moved / 1e6:.0f} MB)")  # fmt: skip
    ref_dx, ref_dw = shipped(fused, a, n)
    best_dx = None
    for bt, bh, warps in itertools.product((16, 32, 64), (64, 128, 256), (4, 8)):
        gx = torch.empty_like(a["x"])
        C = a["w"].shape[0]

        def run():
            _dx_kernel[(n, triton.cdiv(h, bh), triton.cdiv(T, bt))](
                a["x"], a["w"], a["gu"], a["hp"], a["gz"], a["rstd"], a["coef"], a["gxp"], gx, T, h, C,
                N=n, BT=bt, BH=bh, BC=_np2_16(C), ADD_GX=True, PREC="tf32", num_warps=warps,
            )  # fmt: skip

        ms = gpu_ms(run)
        print(f"candidate dx BT,BH,warps={(bt, bh, warps)}: {ms * 1e3:7.1f} us ({moved / ms / 1e9:.2f} TB/s)")
        if best_dx is None or ms < best_dx[0]:
            best_dx = (ms, (bt, bh, warps))
    best_dw = None
    for (bt, bk, ts, warps), low in itertools.product(
        itertools.product((32, 64), (64, 128), (512, 1024, 2048), (4, 8)), (False, True)
    ):
        ms = gpu_ms(lambda: candidate(a, n, best_dx[1], (bt, bk, ts, warps), low)) - best_dx[0]
        err = float((candidate(a, n, best_dx[1], (bt, bk, ts, warps), low)[1] - ref_dw).abs().max() / ref_dw.abs().max())
        ok = err < 2e-2  # bf16 inputs of the low GEMM: ~1e-3 expected; larger is a wrong result
        print(f"candidate dW BT,BK,tokens,warps={(bt, bk, ts, warps)} low={low}: {ms * 1e3:7.1f} us (with the sum), "
              f"max |d dW| / max|dW| {err:.1e}{'' if ok else '  WRONG, not taken'}")  # fmt: skip
        if ok and (best_dw is None or ms < best_dw[0]):
            best_dw = (ms, (bt, bk, ts, warps), low)
    dx, dw = candidate(a, n, best_dx[1], best_dw[1], best_dw[2])
    total = gpu_ms(lambda: candidate(a, n, best_dx[1], best_dw[1], best_dw[2]))
    print(f"best candidate: dx {best_dx[1]}, dW {best_dw[1]} low={best_dw[2]}: {total * 1e3:7.1f} us against "
          f"{base * 1e3:7.1f} us shipped ({total / base:.3f}x); max |d dx| / max|dx| "
          f"{float((dx.float() - ref_dx.float()).abs().max() / ref_dx.float().abs().max()):.2e}, "
          f"max |d dW| / max|dW| {float((dw - ref_dw).abs().max() / ref_dw.abs().max()):.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
