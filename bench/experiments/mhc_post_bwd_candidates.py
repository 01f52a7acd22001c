"""Benchmark (not a test): a candidate replacement for the mHC combine backward kernel, timed and
checked against the shipped one at the bench model's shape.

Why: at 16384 tokens the shipped ``_post_bwd_kernel`` (patch ``mhc-fused-kernels``) moves its
938 MB at 2.8 TB/s, the slowest mHC kernel left after the input backward's split
(bench/experiments/README.md). Each of its programs covers 4 tokens of one hidden block and reduces
``g_i * x_j`` over that block for all n*n pairs (n*n cross-warp reductions per program), writes
the per-block partial ``dH_res`` / ``dH_post`` and leaves two torch sums over the blocks. The
candidate gives each program a few tokens and the whole hidden size: it keeps the products in
elementwise fp32 accumulators while it walks the hidden blocks (no reduction inside the loop),
reduces once at the end and writes ``dH_res`` and ``dH_post`` directly (no partials, no sums).

    python3 bench/experiments/mhc_post_bwd_candidates.py --tokens 16384 --streams 4 --hidden 2048     # on CUDA

On CPU (``TRITON_INTERPRET=1``) :func:`compare` runs both on a small shape; the test in
``tests/bench/test_mhc_post_bwd_candidates.py`` uses that to keep the candidate correct.
"""

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _post_bwd_rows_kernel(
    x_ptr, hr_ptr, hq_ptr, y_ptr, g_ptr, gx_ptr, gy_ptr, ghr_ptr, ghq_ptr, T, H,
    N: tl.constexpr, NP: tl.constexpr, BT: tl.constexpr, BH: tl.constexpr,
):  # fmt: skip
    """For BT tokens over the whole hidden size: dx_j = sum_i H_res[i, j] g_i, dy = sum_i
    H_post[i] g_i (written block by block) and dH_res[i, j] = sum_h g_i x_j, dH_post[i] = sum_h
    g_i y (accumulated elementwise across the blocks, reduced once)."""
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    j = tl.arange(0, NP)
    rmask = rows < T
    m_tn = rmask[:, None] & (j[None, :] < N)
    acc_r = tl.zeros((BT, NP, NP, BH), dtype=tl.float32)  # [token, i, j, h]
    acc_q = tl.zeros((BT, NP, BH), dtype=tl.float32)  # [token, i, h]
    hr = tl.load(
        hr_ptr + rows[:, None, None] * (N * N) + j[None, :, None] * N + j[None, None, :],
        mask=m_tn[:, :, None] & (j[None, None, :] < N), other=0.0,
    )  # fmt: skip
    hq = tl.load(hq_ptr + rows[:, None] * N + j[None, :], mask=m_tn, other=0.0)
    for h0 in range(0, H, BH):
        hs = h0 + tl.arange(0, BH)
        offs = rows[:, None, None].to(tl.int64) * (N * H) + j[None, :, None] * H + hs[None, None, :]
        m = m_tn[:, :, None] & (hs[None, None, :] < H)
        x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)  # [token, j, h]
        g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)  # [token, i, h]
        m2 = rmask[:, None] & (hs[None, :] < H)
        h_offs = rows[:, None].to(tl.int64) * H + hs[None, :]
        y = tl.load(y_ptr + h_offs, mask=m2, other=0.0).to(tl.float32)
        gx = tl.sum(hr[:, :, :, None] * g[:, :, None, :], axis=1)  # sum over i
        gy = tl.sum(hq[:, :, None] * g, axis=1)
        tl.store(gx_ptr + offs, gx.to(gx_ptr.dtype.element_ty), mask=m)
        tl.store(gy_ptr + h_offs, gy.to(gy_ptr.dtype.element_ty), mask=m2)
        acc_r += g[:, :, None, :] * x[:, None, :, :]
        acc_q += g * y[:, None, :]
    ghr = tl.sum(acc_r, axis=3)
    tl.store(
        ghr_ptr + rows[:, None, None] * (N * N) + j[None, :, None] * N + j[None, None, :], ghr,
        mask=m_tn[:, :, None] & (j[None, None, :] < N),
    )  # fmt: skip
    tl.store(ghq_ptr + rows[:, None] * N + j[None, :], tl.sum(acc_q, axis=2), mask=m_tn)


def _np2(v):
    from megatron.core.transformer.hyper_connection_fused import _np2 as shipped_np2

    return shipped_np2(v)


class _Saved:
    """The context ``_PostCombine.backward`` reads, built from plain tensors."""

    def __init__(self, x, h_res, h_post, y):
        self.saved_tensors = (x, h_res, h_post, y)


def shipped(fused, a):
    """``(dx, dH_res, dH_post, dy)`` through the shipped combine backward."""
    return fused._PostCombine.backward(_Saved(a["x"], a["hr"], a["hq"], a["y"]), a["g"])


def candidate(a, shape=(2, 256, 4)):
    """``(dx, dH_res, dH_post, dy)`` through the candidate. ``shape``: (BT, BH, warps)."""
    x, hr, hq, y, g = a["x"], a["hr"], a["hq"], a["y"], a["g"]
    T, n = hq.shape
    h = x.shape[1] // n
    bt, bh, warps = shape
    bh = min(bh, _np2(h))
    gx, gy = torch.empty_like(x), torch.empty_like(y)
    ghr = torch.empty(T, n, n, device=x.device, dtype=torch.float32)
    ghq = torch.empty(T, n, device=x.device, dtype=torch.float32)
    _post_bwd_rows_kernel[(triton.cdiv(T, bt),)](
        x, hr, hq, y, g, gx, gy, ghr, ghq, T, h, N=n, NP=_np2(n), BT=bt, BH=bh, num_warps=warps
    )
    return gx, ghr, ghq, gy


def inputs(T, n, h, dtype, device, seed=0):
    """The tensors the combine backward reads, with the scales they have in training."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def r(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dt)

    return dict(
        x=r(T, n * h), y=r(T, h), g=r(T, n * h),
        hr=torch.softmax(r(T, n, n, dt=torch.float32), -1), hq=2 * torch.rand(T, n, generator=gen).to(device),
    )  # fmt: skip


def compare(T=64, n=4, h=32, dtype=torch.float32, device="cpu", **shape):
    """Largest difference of each candidate output from the shipped kernel's, relative to the
    largest magnitude of that output (both sum in fp32, in other orders)."""
    from megatron.core.transformer import hyper_connection_fused as fused

    a = inputs(T, n, h, dtype, device)
    ref, got = shipped(fused, a), candidate(a, **shape)
    names = ("dx", "dH_res", "dH_post", "dy")
    return {k: float((c.float() - r.float()).abs().max() / r.float().abs().max()) for k, r, c in zip(names, ref, got)}


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
    moved = (4 * T * n * h + 2 * T * h) * 2  # x, g, dx (bf16 streams); y, dy
    base = gpu_ms(lambda: shipped(fused, a))
    print(f"tokens {T}, streams {n}, hidden {h}, bf16: shipped _post_bwd + sums {base * 1e3:7.1f} us "
          f"({moved / base / 1e9:.2f} TB/s on {moved / 1e6:.0f} MB)")  # fmt: skip
    best = None
    for shape in itertools.product((1, 2, 4), (64, 128, 256), (2, 4, 8)):
        try:
            ms = gpu_ms(lambda: candidate(a, shape))
        except Exception as err:  # a shape that does not fit (registers, shared memory)
            print(f"candidate BT,BH,warps={shape}: failed ({type(err).__name__})")
            continue
        errs = compare(T, n, h, torch.bfloat16, "cuda", shape=shape)
        ok = max(errs.values()) < 1e-2
        print(f"candidate BT,BH,warps={shape}: {ms * 1e3:7.1f} us ({moved / ms / 1e9:.2f} TB/s); "
              + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()) + ("" if ok else "  WRONG, not taken"))
        if ok and (best is None or ms < best[0]):
            best = (ms, shape)
    if best:
        print(f"best candidate: {best[1]}: {best[0] * 1e3:7.1f} us against {base * 1e3:7.1f} us shipped "
              f"({best[0] / base:.3f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
