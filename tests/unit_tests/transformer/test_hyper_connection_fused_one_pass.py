"""The fused mHC input node's traffic diet (patch ``mhc-fused-input-one-pass``).

Two changes of how the kernels of hyper_connection_fused.py share work, with the same results
(the float64 formula tests of test_hyper_connection_fused.py hold both to the mHC contract):

- ``mhc_input``'s forward is one kernel per block of tokens (projection, gates, Sinkhorn,
  pre-aggregate), not three launches that each read the streams;
- a combine linked to an input node (``post_combine`` given the ``x`` and ``H_res`` of one
  ``mhc_input`` call) hands that node the gradient of its output as it is, and the node forms
  ``H_res^T g`` where it writes ``dx``, so the combine writes no ``[T, n*h]`` dx of its own.

Checked here by what they change: the launches a forward issues and the gradient that reaches
the input node's pass-through. CPU cases run under Triton's interpreter in a child process (see
tests/unit_tests/triton_interpreter.py); the GPU class repeats them on CUDA in bf16.
"""

import pytest
import torch

triton = pytest.importorskip("triton")

from megatron.core.transformer import hyper_connection_fused as fused
from tests.unit_tests.triton_interpreter import (
    assert_interpreter_suite_passes,
    interpreter_parent,
)

EPS = 1e-5
ITERS = 4


class _Counted:
    """Stands in for a Triton kernel object and records each launch (``kernel[grid](...)``)."""

    def __init__(self, kernel, name, launches):
        self.kernel, self.name, self.launches = kernel, name, launches

    def __getitem__(self, grid):
        self.launches.append(self.name)
        return self.kernel[grid]


def _count_launches(monkeypatch):
    """Replace every ``*_kernel`` of the fused module by a counting stand-in; returns the log."""
    launches = []
    for name in dir(fused):
        if name.endswith("_kernel"):
            monkeypatch.setattr(fused, name, _Counted(getattr(fused, name), name, launches))
    assert any(n.endswith("_kernel") for n in dir(fused))
    return launches


def _leaves(T, n, h, device, dtype, seed=3):
    gen = torch.Generator().manual_seed(seed)
    C = n * n + 2 * n

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype).requires_grad_(True)

    return dict(
        x=rnd(T, n * h), w=rnd(C, n * h, scale=0.3), b=rnd(C, scale=0.5),
        a_pre=rnd(1), a_post=rnd(1), a_res=rnd(1),
    )  # fmt: skip


def _input(p, n):
    return fused.mhc_input(
        p["x"], p["w"], p["b"], p["a_pre"], p["a_post"], p["a_res"],
        num_streams=n, sinkhorn_iters=ITERS, norm_eps=EPS,
    )  # fmt: skip


def _forward_is_one_launch(monkeypatch, device, dtype):
    n, h, T = 4, 40, 9
    p = _leaves(T, n, h, device, dtype)
    launches = _count_launches(monkeypatch)
    u, h_post, h_res = _input(p, n)
    assert launches == ["_in_fwd_kernel"], launches
    # The one launch wrote every output: the pre-aggregate with the gates it computed itself.
    assert torch.isfinite(u).all() and torch.isfinite(h_res).all()
    rows = h_res.sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-5, rtol=0)
    assert (h_post > 0).all() and (h_post < 2).all()


def _linked_combine_hands_g_through(device, dtype):
    n, h, T = 3, 24, 7
    p = _leaves(T, n, h, device, dtype)
    u, h_post, h_res = _input(p, n)
    streams = h_res._mhc_streams[1]
    seen = []
    streams.register_hook(lambda g: seen.append(g.detach().clone()))
    out = fused.post_combine(p["x"], h_res, h_post, torch.tanh(u))
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(device=device, dtype=dtype)
    out.backward(g)
    # What reaches the pass-through is g itself (the node forms H_res^T g), not a dx the
    # combine wrote; and x's gradient still holds the combine's H_res^T g term (checked against
    # the same input node with the combine on an unlinked copy of x).
    assert len(seen) == 1 and torch.equal(seen[0], g.reshape(seen[0].shape))
    q = {k: v.detach().clone().requires_grad_(True) for k, v in p.items()}
    u2, h_post2, h_res2 = _input(q, n)
    out2 = fused.post_combine(q["x"].clone(), h_res2, h_post2, torch.tanh(u2))
    out2.backward(g)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(p["x"].grad, q["x"].grad, **tol)
    for k in ("w", "b", "a_pre", "a_post", "a_res"):
        torch.testing.assert_close(p[k].grad, q[k].grad, **tol)


def _unlinked_combine_writes_its_own_dx(device, dtype):
    n, h, T = 3, 24, 7
    p = _leaves(T, n, h, device, dtype)
    x = p["x"]
    h_res = torch.softmax(torch.randn(T, n, n, generator=torch.Generator().manual_seed(4)), -1).to(device)
    h_post = torch.rand(T, n, generator=torch.Generator().manual_seed(5)).to(device)
    y = torch.randn(T, h, generator=torch.Generator().manual_seed(6)).to(device=device, dtype=dtype)
    out = fused.post_combine(x, h_res, h_post, y)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(device=device, dtype=dtype)
    out.backward(g)
    want = torch.einsum("tij,tih->tjh", h_res.double(), g.double().reshape(T, n, h)).reshape(T, n * h)
    torch.testing.assert_close(x.grad.double(), want, atol=1e-5, rtol=1e-4)


@interpreter_parent
def test_interpreter_suite_in_subprocess():
    """Run TestOnePassInterpreter under TRITON_INTERPRET=1 in a fresh interpreter."""
    assert_interpreter_suite_passes(__file__, "TestOnePassInterpreter", timeout=600)


@pytest.mark.triton_interpreter_child
class TestOnePassInterpreter:
    def test_input_forward_is_one_launch(self, monkeypatch):
        _forward_is_one_launch(monkeypatch, "cpu", torch.float32)

    def test_linked_combine_hands_g_to_the_input_node(self):
        _linked_combine_hands_g_through("cpu", torch.float32)

    def test_unlinked_combine_writes_its_own_dx(self):
        _unlinked_combine_writes_its_own_dx("cpu", torch.float32)


@pytest.mark.gpu
class TestOnePassOnGPU:  # run on the H200
    @pytest.fixture(autouse=True)
    def _cuda(self):
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_input_forward_is_one_launch(self, monkeypatch, dtype):
        _forward_is_one_launch(monkeypatch, "cuda", dtype)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_linked_combine_hands_g_to_the_input_node(self, dtype):
        _linked_combine_hands_g_through("cuda", dtype)

    def test_unlinked_combine_writes_its_own_dx(self):
        _unlinked_combine_writes_its_own_dx("cuda", torch.float32)
