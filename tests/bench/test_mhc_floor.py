"""bench/experiments/mhc_floor.py: the model bench's lower-bound stand-in for the fused mHC functions. Its
values are not mHC's, so what is checked is what the bound relies on: the same shapes and
autograd contract as the fused functions (every parameter gets a gradient, the linked combine's
gradient reaches the input node), the gradient it is built to give, and no stream-sized tensor
saved for backward besides the streams themselves."""

import torch

from bench.experiments import mhc_floor
from megatron.core.transformer import hyper_connection as native

N, H, T = 4, 8, 32  # x larger than the mapping weight, which is saved (a parameter)


def _leaves():
    gen = torch.Generator().manual_seed(0)
    C = N * N + 2 * N
    p = dict(
        x=torch.randn(T, N * H, generator=gen), w=torch.randn(C, N * H, generator=gen),
        b=torch.randn(C, generator=gen), a_pre=torch.ones(1), a_post=torch.ones(1), a_res=torch.ones(1),
    )  # fmt: skip
    return {k: v.requires_grad_(True) for k, v in p.items()}


def _input(mod, p):
    return mod.mhc_input(
        p["x"], p["w"], p["b"], p["a_pre"], p["a_post"], p["a_res"],
        num_streams=N, sinkhorn_iters=3, norm_eps=1e-5,
    )  # fmt: skip


def test_same_shapes_as_the_real_functions():
    p = _leaves()
    got, want = _input(mhc_floor, p), _input(native, p)
    assert [t.shape for t in got] == [t.shape for t in want]
    out = mhc_floor.post_combine(p["x"], got[2], got[1], got[0])
    assert out.shape == native.post_combine(p["x"], want[2], want[1], want[0]).shape
    weights = mhc_floor.head_weights(p["x"], torch.randn(N, N * H), torch.zeros(N), torch.ones(1), norm_eps=1e-5)
    assert weights.shape == (T, N)
    assert mhc_floor.pre_aggregate(p["x"], weights).shape == (T, H)


def test_gradient_through_the_linked_pair():
    # out = x + [2u into stream 0], u = stream 0 of x: dL/dx = g, plus 2 g_0 on stream 0.
    p = _leaves()
    u, h_post, h_res = _input(mhc_floor, p)
    out = mhc_floor.post_combine(p["x"], h_res, h_post, 2 * u)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    out.backward(g)
    want = g.clone()
    want[:, :H] += 2 * g[:, :H]
    torch.testing.assert_close(p["x"].grad, want, rtol=0, atol=0)
    for name in ("w", "b", "a_pre", "a_post", "a_res"):
        assert p[name].grad is not None and torch.isfinite(p[name].grad).all(), name


def test_saves_no_stream_sized_copy():
    p = _leaves()
    saved = []

    def pack(t):
        if t.numel() >= p["x"].numel() and t.data_ptr() != p["x"].data_ptr():
            saved.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        u, h_post, h_res = _input(mhc_floor, p)
        mhc_floor.post_combine(p["x"], h_res, h_post, u)
    assert saved == []


def test_install_replaces_the_fused_functions(monkeypatch):
    from megatron.core.transformer import hyper_connection_fused as fused

    for name in mhc_floor._NAMES:
        monkeypatch.setattr(fused, name, getattr(fused, name))  # restored after the test
    mhc_floor.install()
    for name in mhc_floor._NAMES:
        assert getattr(fused, name) is getattr(mhc_floor, name)


def test_the_linked_combine_hands_the_streams_gradient_to_the_input_node():
    # The bound counts one dx write per sublayer: the combine given the input node's x mixes the
    # node's pass-through, so the streams' gradient reaches the node as it is (no second
    # stream-sized gradient for autograd to add).
    p = _leaves()
    u, h_post, h_res = _input(mhc_floor, p)
    seen = []
    h_res._mhc_floor_streams[1].register_hook(lambda g: seen.append(g.detach().clone()))
    out = mhc_floor.post_combine(p["x"], h_res, h_post, u)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    out.backward(g)
    assert len(seen) == 1 and torch.equal(seen[0], g)
