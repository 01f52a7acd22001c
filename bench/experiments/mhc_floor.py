"""Benchmark stand-in (never for training): mHC functions that move about the least memory any
mHC implementation must move, so that the model bench can measure what the step target allows.

Why: the fused kernels' step cost (1.19x at hidden 2048) was compared with a floor computed on
paper (bench/experiments/README.md: ~1.065x from 5 stream-sized and 5 sublayer-sized
passes per sublayer). This module puts that floor into the real model instead, with its host
side, its allocator and everything else mHC brings (the n-stream checkpoints, the MTP layer's
GEMMs on 4 streams, the contraction head): ``te_bench.py``'s ``fork+mhc-floor`` runs the mHC
model with these functions in place of :mod:`megatron.core.transformer.hyper_connection_fused`.

What each function moves, per sublayer (T tokens, n streams of hidden h, the activation dtype):

- :func:`mhc_input`: forward copies the first stream's slice as the sublayer input (one
  sublayer-sized read and write; a fused design would write ``u`` from the previous combine);
  backward reads the streams' gradient and ``x`` once (the reductions a real backward needs)
  and writes ``dx`` once.
- :func:`post_combine`: forward reads ``x`` and ``y`` and writes the new streams once; backward
  hands the streams' gradient through untouched (a real design folds it into the input node's
  pass) and writes ``dy``.

The values are not mHC's (the mappings are constants of the parameters); every parameter still
gets a gradient, so the optimizer and the recompute paths run as they do with mHC.
"""

import torch
from torch import Tensor

_NAMES = ("mhc_input", "post_combine", "mhc_mappings", "pre_aggregate", "head_weights")


def _maps(x: Tensor, n: int, bias: Tensor, dtype=torch.float32):
    """Constant mappings of the right shapes (``H_pre``, ``H_post`` ``[..., n]``, ``H_res`` ``[..., n, n]``)."""
    lead = x.shape[:-1]
    b = bias.detach().float()
    h_pre = torch.sigmoid(b[:n]).to(dtype).expand(*lead, n).contiguous()
    h_post = (2 * torch.sigmoid(b[n : 2 * n])).to(dtype).expand(*lead, n).contiguous()
    h_res = torch.eye(n, device=x.device, dtype=dtype).expand(*lead, n, n).contiguous()
    return h_pre, h_post, h_res


class _Input(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, bias, a_pre, a_post, a_res, n):
        ctx.set_materialize_grads(False)
        h = x.shape[-1] // n
        ctx.save_for_backward(x, w, bias, a_pre, a_post, a_res)
        ctx.n = n
        u = x[..., :h].contiguous()
        _, h_post, h_res = _maps(x, n, bias)
        return u, h_post, h_res, x

    @staticmethod
    def backward(ctx, gu, g_post, g_res, g_streams):
        x, w, bias, a_pre, a_post, a_res = ctx.saved_tensors
        h = x.shape[-1] // ctx.n
        gx = torch.zeros_like(x) if g_streams is None else g_streams.clone()
        if gu is not None:
            gx[..., :h] += gu
        # One read of x, as the dH_pre / dW reductions of a real backward need.
        scale = (torch.sum(x, dtype=torch.float32) * 0).to(a_pre.dtype)
        zeros = [torch.zeros_like(t) for t in (w, bias, a_pre, a_post, a_res)]
        zeros[2] = zeros[2] + scale
        return (gx, *zeros, None)


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        h = y.shape[-1]
        out = x.clone()
        out[..., :h] += y
        ctx.h = h
        return out

    @staticmethod
    def backward(ctx, g):
        return g, g[..., : ctx.h].contiguous()


def mhc_input(x, mapping_weight, mapping_bias, alpha_pre, alpha_post, alpha_res, *, num_streams,
              sinkhorn_iters, norm_eps):  # fmt: skip
    """``(u, H_post, H_res)`` like the fused ``mhc_input``, at the floor's traffic."""
    u, h_post, h_res, streams = _Input.apply(
        x, mapping_weight, mapping_bias, alpha_pre, alpha_post, alpha_res, num_streams
    )
    h_res._mhc_floor_streams = (x, streams)
    return u, h_post, h_res


def post_combine(x: Tensor, h_res: Tensor, h_post: Tensor, y: Tensor) -> Tensor:
    """New streams from ``x`` and the sublayer output ``y`` (``y`` added to the first stream)."""
    link = getattr(h_res, "_mhc_floor_streams", None)
    src = link[1] if link is not None and link[0] is x else x
    return _Combine.apply(src, y.to(x.dtype))


def mhc_mappings(x, mapping_weight, mapping_bias, alpha_pre, alpha_post, alpha_res, *, num_streams,
                 sinkhorn_iters, norm_eps):  # fmt: skip
    """Constant ``(H_pre, H_post, H_res)``; the parameters get zero gradients through a tiny term."""
    tie = (mapping_weight.sum() + alpha_pre.sum() + alpha_post.sum() + alpha_res.sum()).float() * 0
    h_pre, h_post, h_res = _maps(x, num_streams, mapping_bias)
    return h_pre + tie, h_post + tie, h_res + tie


def pre_aggregate(x: Tensor, h_pre: Tensor) -> Tensor:
    """The first stream, scaled by its weight (one sublayer-sized read and write)."""
    n = h_pre.shape[-1]
    h = x.shape[-1] // n
    return x[..., :h] * h_pre[..., :1].to(x.dtype)


def head_weights(x, head_fn, head_base, head_scale, *, norm_eps):
    """Constant head weights ``[..., n]`` from the head's parameters."""
    n = head_base.shape[0]
    w = torch.sigmoid(head_scale.float() * head_base.float()) + head_fn.float().sum() * 0
    return w.expand(*x.shape[:-1], n)


def install() -> None:
    """Put these functions in place of the fused module's (run with ``use_fused_mhc=True``)."""
    from megatron.core.transformer import hyper_connection_fused as fused

    for name in _NAMES:
        setattr(fused, name, globals()[name])
