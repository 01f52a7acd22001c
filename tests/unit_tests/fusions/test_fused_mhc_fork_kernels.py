"""The fork's Triton kernels for upstream dev's mHC native fallbacks (upstream-dev line only).

On the upstream-dev line, ``mhc-fused-kernels`` gives dev's ``use_fused_mhc`` path Triton kernels
where dev has only native torch (no working cuTile), in
``megatron/core/transformer/hyper_connection_fused.py``: the backward of ``u = sum_j H_pre[j] x_j``
and the projection + RMS + compute-H op (``proj_rms_compute_h``, forward and backward). These
tests hold them to dev's own native functions, which are their reference: on CPU in Triton's
interpreter, on a GPU through dev's public fused ops and through a whole HyperConnectionModule.
The release and upstream-main lines have no dev fused module: the file skips there.
"""

import types

import pytest
import torch

from tests.unit_tests.triton_interpreter import (
    INTERPRETING,
    assert_interpreter_suite_passes,
    interpreter_parent,
)

dev_kernels = pytest.importorskip(
    "megatron.core.fusions.fused_mhc_kernels", reason="upstream dev's fused mHC module (upstream-dev line)"
)

# dev's own tolerances for its fused mHC ops against their references
# (tests/unit_tests/fusions/test_fused_mhc_kernels.py at d48bd6be).
FWD_TOL, BWD_TOL = 2e-2, 5e-2


def _fork_kernels():
    from megatron.core.transformer import hyper_connection_fused

    return hyper_connection_fused


def _streams(s, b, n, C, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(s, b, n, C, generator=g, device=device).to(dtype)
    h_pre = (torch.rand(s, b, n, generator=g, device=device) + 0.1).to(dtype)
    grad = torch.randn(s, b, C, generator=g, device=device).to(dtype)
    return x, h_pre, grad


def _dev_native_proj():
    """dev's native ``_torch_proj_rms_compute_h``; on CPU without its ``torch.compile`` wrapper
    (the same function, no inductor build in the interpreter runs)."""
    fn = dev_kernels._torch_proj_rms_compute_h
    if torch.cuda.is_available():
        return fn
    return getattr(fn, "_torchdynamo_orig_callable", fn)


def _proj_inputs(T, n, C, dtype, device, seed, zero_row=None):
    """x [T, n*C] and dev's fp32 mapping parameters (random alphas and bias), plus upstream
    gradients for the four outputs."""
    g = torch.Generator(device=device).manual_seed(seed)
    N = n * n + 2 * n
    x = torch.randn(T, n * C, generator=g, device=device)
    if zero_row is not None:
        x[zero_row] = 0.0  # r == 0: dev's norm backward gives this row no r-term
    x = x.to(dtype)
    weight = torch.randn(N, n * C, generator=g, device=device) / (n * C) ** 0.5
    alphas = [torch.rand(1, generator=g, device=device) + 0.2 for _ in range(3)]
    bias = torch.randn(N, generator=g, device=device) * 0.3
    grads = [torch.randn(T, k, generator=g, device=device) for k in (n, n, n * n, 1)]
    return x, weight, alphas, bias, grads


def _run_proj(fn, x, weight, alphas, bias, n, grads, used=(0, 1, 2, 3)):
    """Forward and backward of a proj_rms_compute_h implementation; returns outputs and the
    gradients of x, weight, the three alphas and bias (outputs not in ``used`` get no gradient)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, weight, *alphas, bias)]
    outs = fn(leaves[0], leaves[1], *leaves[2:5], leaves[5], n, 1e-6, 1e-6)
    torch.autograd.backward([outs[i] for i in used], [grads[i] for i in used])
    return [o.detach() for o in outs], [leaf.grad for leaf in leaves]


def _assert_proj_close(got, ref, x_dtype, rel):
    """Outputs and every gradient of two proj_rms_compute_h runs: same dtypes and shapes; values
    within ``rel`` of each tensor's scale (dx: of each row's, and one rounding of x's dtype more)."""
    (outs, grads), (routs, rgrads) = got, ref
    names = ["h_pre", "h_post", "h_res", "r", "dx", "dweight", "dalpha_pre", "dalpha_post", "dalpha_res", "dbias"]
    for name, a, b in zip(names, outs + grads, routs + rgrads):
        assert b is not None and a is not None, name
        assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, b.dtype, a.shape, b.shape)
        if name == "dx":  # per row: a zero row of x has a large dx (1 / eps through r)
            tol = rel if x_dtype == torch.float32 else max(rel, torch.finfo(x_dtype).eps)
            err = (a.float() - b.float()).abs().amax(1)
            bound = tol * b.float().abs().amax(1) + 1e-30
            assert bool((err <= bound).all()), f"dx: rows {(err > bound).nonzero().flatten().tolist()}"
            continue
        scale = b.float().abs().max().item() + 1e-30
        err = (a.float() - b.float()).abs().max().item()
        assert err <= rel * scale, f"{name}: max |diff| {err:.3e} > {rel:.1e} * {scale:.3e}"


class TestBackendSelection:
    def test_status_names_triton_for_the_aggregation_backward(self):
        """Where Triton imports and cuTile does not run, dev's status names Triton, not native."""
        if not dev_kernels._TRITON_AVAILABLE or dev_kernels.is_cutile_available():
            pytest.skip("needs Triton importable and cuTile not running")
        message, _ = dev_kernels._mhc_backend_status()
        assert "h_aggregate=fwd:triton,bwd:triton" in message, message

    def test_status_names_triton_for_the_projection(self):
        """Where Triton imports and cuTile does not run, dev's status names Triton for its
        proj_rms_compute_h, not native."""
        if not dev_kernels._TRITON_AVAILABLE or dev_kernels.is_cutile_available():
            pytest.skip("needs Triton importable and cuTile not running")
        message, _ = dev_kernels._mhc_backend_status()
        assert "proj_rms_compute_h=triton" in message, message

    def test_forced_native_backend_keeps_dev_native_backward(self, monkeypatch):
        """MHC_FORCE_BACKEND=native (dev's switch) leaves the fork's kernels out."""
        monkeypatch.setattr(dev_kernels, "_TRITON_AVAILABLE", False)
        monkeypatch.setattr(dev_kernels, "_CUTILE_AVAILABLE", False)
        message, _ = dev_kernels._mhc_backend_status()
        assert "bwd:native" in message, message
        assert "proj_rms_compute_h=native" in message, message

    def test_forced_native_backend_keeps_dev_native_projection(self, monkeypatch):
        """With Triton switched off by dev's switches, dev's public op runs its native function
        even where the fork's kernel would take the arguments."""
        fk = _fork_kernels()
        monkeypatch.setattr(dev_kernels, "_TRITON_AVAILABLE", False)
        monkeypatch.setattr(fk, "proj_usable", lambda *a: True)
        monkeypatch.setattr(fk, "proj_rms_compute_h", lambda *a: pytest.fail("fork kernel ran"))
        x, w, alphas, bias, grads = _proj_inputs(6, 2, 8, torch.float32, "cpu", seed=1)
        native = getattr(dev_kernels._torch_proj_rms_compute_h, "_torchdynamo_orig_callable", None)
        if native is not None:
            monkeypatch.setattr(dev_kernels, "_torch_proj_rms_compute_h", native)
        outs = dev_kernels.fused_proj_rms_compute_h(x, w, *alphas, bias, 2)
        assert len(outs) == 4 and outs[0].shape == (6, 2)

    def test_unknown_backward_schedule_is_refused_by_name(self, monkeypatch):
        """A misspelt _PROJ_BWD_SCHEDULE stops the backward with its name and the choices,
        before any kernel runs, instead of falling back to one of the schedules."""
        fk = _fork_kernels()
        monkeypatch.setattr(fk, "_PROJ_BWD_SCHEDULE", "splitt")
        x, proj = torch.zeros(4, 8), torch.zeros(4, 16)
        with pytest.raises(ValueError, match=r"_PROJ_BWD_SCHEDULE is 'splitt'; expected one of \('fused', 'split'\)"):
            fk._proj_backward(None, None, None, None, x, None, proj, None, None, None, None, None, 2, 1e-6)

    def test_projection_takes_only_dev_cuda_fp32_parameters(self):
        """The projection kernel takes dev's op only with CUDA tensors, x [T > 0, K] of an
        activation dtype and dev's fp32 mapping parameters of its shapes; otherwise native."""
        fk = _fork_kernels()

        def t(shape, dtype=torch.float32, cuda=True):
            return types.SimpleNamespace(
                is_cuda=cuda, dtype=dtype, shape=torch.Size(shape),
                dim=lambda: len(shape), numel=lambda: int(torch.Size(shape).numel()),
            )  # fmt: skip

        n, K = 4, 64
        good = dict(x=t((10, K), torch.bfloat16), weight=t((24, K)), alpha_pre=t((1,)),
                    alpha_post=t((1,)), alpha_res=t((1,)), bias=t((24,)), n=n)  # fmt: skip
        if not fk.available():
            assert not fk.proj_usable(**good)
            return
        assert fk.proj_usable(**good)
        for dtype in (torch.float32, torch.float16):
            assert fk.proj_usable(**{**good, "x": t((10, K), dtype)}), dtype
        bad = {
            "cpu x": {"x": t((10, K), torch.bfloat16, cuda=False)},
            "float64 x": {"x": t((10, K), torch.float64)},
            "3-d x": {"x": t((10, 1, K), torch.bfloat16)},
            "no tokens": {"x": t((0, K), torch.bfloat16)},
            "bf16 weight": {"weight": t((24, K), torch.bfloat16)},
            "weight width": {"weight": t((24, K + 1))},
            "weight rows for n": {"n": 3},
            "bf16 bias": {"bias": t((24,), torch.bfloat16)},
            "two-element alpha": {"alpha_res": t((2,))},
            "cpu alpha": {"alpha_pre": t((1,), cuda=False)},
        }
        for what, change in bad.items():
            assert not fk.proj_usable(**{**good, **change}), what
        with pytest.raises(ValueError, match="proj_rms_compute_h"):
            fk.proj_rms_compute_h(torch.zeros(2, K), torch.zeros(24, K), *[torch.ones(1)] * 3,
                                  torch.zeros(24), n)  # fmt: skip

    def test_kernel_takes_cuda_tensors_of_activation_dtypes_only(self):
        """Dev's backward on CPU tensors (or float64, or integers) must stay native."""
        fk = _fork_kernels()
        assert not fk.usable(torch.zeros(2, 4, dtype=torch.bfloat16))
        if not fk.available():
            return
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            assert fk.usable(types.SimpleNamespace(is_cuda=True, dtype=dtype)), dtype
        for dtype in (torch.float64, torch.int32):
            assert not fk.usable(types.SimpleNamespace(is_cuda=True, dtype=dtype)), dtype


@pytest.mark.triton_interpreter_child
class TestAggregateBackwardInterpreter:
    """Runs only under TRITON_INTERPRET=1 (test_interpreter_suite_in_subprocess starts it)."""

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    @pytest.mark.parametrize("shape", [(5, 3, 4, 64), (7, 1, 4, 40), (3, 2, 2, 96), (3, 1, 3, 300)])
    def test_matches_dev_native_backward(self, dtype, shape):
        x, h_pre, grad = _streams(*shape, dtype, "cpu", seed=sum(shape))
        gx, gh = _fork_kernels().h_aggregate_backward(grad, x, h_pre)
        rx, rh = dev_kernels._torch_h_aggregate_bwd(grad, x, h_pre)
        assert gx.dtype == rx.dtype and gh.dtype == rh.dtype
        assert gx.shape == rx.shape and gh.shape == rh.shape
        # dx is one product per element: equal up to one rounding of the output dtype.
        tol = 0.0 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(gx.float(), rx.float(), atol=tol * gx.float().abs().max().item(), rtol=tol)
        # dH_pre is a reduction over C in fp32 on both sides.
        torch.testing.assert_close(gh.float(), rh.float(), atol=1e-4, rtol=1e-4 if dtype == torch.float32 else 1e-2)

    @pytest.mark.parametrize("into", [False, True])
    def test_dev_fused_ops_run_it_in_their_backward(self, monkeypatch, into):
        """dev's FusedHAggregate and FusedHAggregateInto backwards call the kernel (the forward on
        dev's native path; ``usable`` widened to CPU tensors, which the interpreter runs)."""
        fk = _fork_kernels()
        calls, real = [], fk.h_aggregate_backward
        monkeypatch.setattr(fk, "h_aggregate_backward", lambda *a: calls.append(1) or real(*a))
        monkeypatch.setattr(fk, "usable", lambda x: True)
        monkeypatch.setattr(dev_kernels, "_get_triton_h_aggregate_fwd", lambda: None)
        monkeypatch.setattr(dev_kernels, "_TRITON_AVAILABLE", True)
        x, h_pre, grad = _streams(6, 2, 4, 48, torch.bfloat16, "cpu", seed=11)
        xf, hf = x.clone().requires_grad_(True), h_pre.clone().requires_grad_(True)
        if into:
            out = torch.empty(6, 2, 48, dtype=x.dtype)
            dev_kernels.fused_h_aggregate_into(xf, hf, out).backward(grad)
        else:
            dev_kernels.fused_h_aggregate(xf, hf).backward(grad)
        assert calls == [1], "dev's fused aggregation backward did not run the fork's kernel"
        rx, rh = dev_kernels._torch_h_aggregate_bwd(grad, x, h_pre)
        torch.testing.assert_close(xf.grad, rx, atol=BWD_TOL, rtol=BWD_TOL)
        torch.testing.assert_close(hf.grad, rh, atol=BWD_TOL, rtol=BWD_TOL)


def _use_schedule(monkeypatch, schedule, chunk=128):
    """The projection backward's schedule for one test; the split one with ``chunk``-channel
    chunks (small, so the interpreter's widths span several and end in a partial one; None keeps
    the module's). Returns the list of the
    schedules whose kernels then ran (both compute the same values, so the values alone cannot
    tell which one did)."""
    fk = _fork_kernels()
    monkeypatch.setattr(fk, "_PROJ_BWD_SCHEDULE", schedule)
    if chunk is not None:
        monkeypatch.setattr(fk, "_PROJ_DX_CHUNK", chunk)
    ran = []
    for name in ("fused", "split"):
        real = getattr(fk, f"_proj_backward_{name}")
        monkeypatch.setattr(fk, f"_proj_backward_{name}",
                            lambda *a, _name=name, _real=real: ran.append(_name) or _real(*a))  # fmt: skip
    return ran


@pytest.fixture
def interpreter_bf16_dot():
    """Triton's interpreter (3.9) stores bf16 as uint16 and multiplies those raw bits in
    ``tl.dot``; the GPU multiplies the bf16 values. This turns bf16 operands of the interpreter's
    dot into the fp32 values they stand for, for the length of one test (the kernels unchanged)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    real = interpreter.InterpreterBuilder.create_dot

    def as_fp32(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        values = (handle.data.astype(np.uint32) << 16).view(np.float32)
        return interpreter.TensorHandle(values, tl.float32)

    def create_dot(self, a, b, d, *rest):
        return real(self, as_fp32(a), as_fp32(b), d, *rest)

    interpreter.InterpreterBuilder.create_dot = create_dot
    try:
        yield
    finally:
        interpreter.InterpreterBuilder.create_dot = real


@pytest.mark.triton_interpreter_child
@pytest.mark.usefixtures("interpreter_bf16_dot")
class TestProjRmsComputeHInterpreter:
    """Runs only under TRITON_INTERPRET=1 (test_projection_interpreter_suite starts it). Shapes
    with token counts and widths that are not multiples of the kernels' blocks (64 tokens, 128
    channels), so the masked edges and more than one split of each reduction are exercised."""

    @pytest.fixture(autouse=True)
    def _cpu_tensors_taken(self, monkeypatch):
        monkeypatch.setattr(_fork_kernels(), "proj_usable", lambda *a: True)

    @pytest.mark.parametrize(
        "dtype,shape",
        [
            (torch.bfloat16, (70, 4, 40)),  # 70 tokens, K = 160
            (torch.bfloat16, (130, 4, 72)),  # 3 token tiles, K = 288 (3 channel blocks)
            (torch.float32, (33, 4, 64)),
            (torch.float16, (5, 2, 96)),  # n = 2: 8 mapping columns, padded to 16
            (torch.bfloat16, (9, 3, 50)),  # n = 3: 15 columns
        ],
    )
    @pytest.mark.parametrize("schedule", ["fused", "split"])
    def test_matches_dev_native(self, dtype, shape, schedule, monkeypatch):
        ran = _use_schedule(monkeypatch, schedule)
        T, n, C = shape
        # a zero row (r == 0) too, but not in fp16: there dev's dx of that row overflows to inf
        zero_row = None if dtype == torch.float16 else T // 2
        x, w, alphas, bias, grads = _proj_inputs(T, n, C, dtype, "cpu", seed=sum(shape), zero_row=zero_row)
        got = _run_proj(_fork_kernels().proj_rms_compute_h, x, w, alphas, bias, n, grads)
        ref = _run_proj(_dev_native_proj(), x, w, alphas, bias, n, grads)
        assert ran == [schedule], ran
        # fp32 on both sides (the bf16 split products are exact): a few fp32 roundings apart.
        _assert_proj_close(got, ref, dtype, rel=2e-5)

    @pytest.mark.parametrize("schedule", ["fused", "split"])
    @pytest.mark.parametrize("used", [(0,), (1,), (2,), (3,), (0, 2)])
    def test_gradient_of_some_outputs_only(self, used, schedule, monkeypatch):
        """Outputs left out of the loss get no gradient (None in the backward): the rest still
        match dev's, including a gradient through r alone."""
        ran = _use_schedule(monkeypatch, schedule)
        x, w, alphas, bias, grads = _proj_inputs(40, 4, 24, torch.bfloat16, "cpu", seed=5)
        got = _run_proj(_fork_kernels().proj_rms_compute_h, x, w, alphas, bias, 4, grads, used)
        assert ran == [schedule], ran
        ref = _run_proj(_dev_native_proj(), x, w, alphas, bias, 4, grads, used)
        for i, (a, b) in enumerate(zip(got[1], ref[1])):
            if b is None:  # dev's graph gives no gradient there (e.g. r alone: no weight path)
                assert a is None or not a.abs().any(), i
                continue
            scale = b.float().abs().max().item() + 1e-30
            tol = torch.finfo(torch.bfloat16).eps if i == 0 else 2e-5
            assert (a.float() - b.float()).abs().max().item() <= tol * scale, i

    def test_dev_public_op_runs_it(self, monkeypatch):
        """dev's fused_proj_rms_compute_h takes the fork's kernel where cuTile does not run."""
        fk = _fork_kernels()
        calls, real = [], fk.proj_rms_compute_h
        monkeypatch.setattr(fk, "proj_rms_compute_h", lambda *a: calls.append(1) or real(*a))
        monkeypatch.setattr(dev_kernels, "_TRITON_AVAILABLE", True)
        monkeypatch.setattr(dev_kernels, "is_cutile_available", lambda: False)
        x, w, alphas, bias, grads = _proj_inputs(67, 4, 32, torch.bfloat16, "cpu", seed=7)
        got = _run_proj(dev_kernels.fused_proj_rms_compute_h, x, w, alphas, bias, 4, grads)
        assert calls == [1], "dev's fused_proj_rms_compute_h did not run the fork's kernel"
        _assert_proj_close(got, _run_proj(_dev_native_proj(), x, w, alphas, bias, 4, grads),
                           torch.bfloat16, rel=2e-5)  # fmt: skip

    def test_hyper_connection_module_fused_matches_native(self, monkeypatch):
        """dev's HyperConnectionModule.compute_mappings with use_fused_mhc=True (the fork's kernel
        for the projection, dev's native Sinkhorn: its Triton one autotunes, which the interpreter
        cannot) against use_fused_mhc=False: mappings and every gradient."""
        from megatron.core.transformer import TransformerConfig
        from megatron.core.transformer.hyper_connection import HyperConnectionModule
        from tests.unit_tests import cpu_compat

        fk = _fork_kernels()
        calls, real = [], fk.proj_rms_compute_h
        monkeypatch.setattr(fk, "proj_rms_compute_h", lambda *a: calls.append(1) or real(*a))
        monkeypatch.setattr(dev_kernels, "_get_triton_sinkhorn", lambda: None)
        monkeypatch.setattr(torch.cuda, "nvtx", cpu_compat._NoNvtx())
        n, C = 4, 32
        kw = dict(num_layers=2, hidden_size=C, num_attention_heads=4, enable_hyper_connections=True,
                  num_residual_streams=n)  # fmt: skip
        torch.manual_seed(0)
        native = HyperConnectionModule(TransformerConfig(**kw), layer_number=1)
        with torch.no_grad():
            for p in (native.alpha_pre, native.alpha_post, native.alpha_res, native.bias):
                p.uniform_(0.2, 1.0)
        fused = HyperConnectionModule(TransformerConfig(use_fused_mhc=True, **kw), layer_number=1)
        fused.load_state_dict(native.state_dict())
        x = torch.randn(9, 2, n * C).bfloat16()
        mix = torch.randn(n, n)
        results = []
        for module in (native, fused):
            xi = x.clone().requires_grad_(True)
            h_pre, h_post, h_res = module.compute_mappings(xi)
            loss = h_pre.float().square().sum() + (h_post.float() * h_pre.float()).sum()
            (loss + (h_res.float() * mix).sum()).backward()
            grads = [xi.grad] + [p.grad for _, p in sorted(module.named_parameters())]
            results.append([h_pre, h_post, h_res] + grads)
        assert calls == [1], "the fused module did not run the fork's projection kernel"
        for got, ref in zip(*results):
            assert got is not None and ref is not None and got.dtype == ref.dtype
            torch.testing.assert_close(got.float(), ref.float(), atol=FWD_TOL * 1e-2, rtol=1e-2)


@interpreter_parent
def test_interpreter_suite_in_subprocess():
    """Run TestAggregateBackwardInterpreter under TRITON_INTERPRET=1 in a fresh interpreter."""
    assert_interpreter_suite_passes(__file__, "TestAggregateBackwardInterpreter", timeout=600)


@interpreter_parent
def test_projection_interpreter_suite():
    """Run TestProjRmsComputeHInterpreter under TRITON_INTERPRET=1 in a fresh interpreter."""
    assert_interpreter_suite_passes(__file__, "TestProjRmsComputeHInterpreter", timeout=900)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETING, reason="GPU case")
class TestOnGpu:
    def test_fused_op_backward_runs_the_fork_kernel_and_matches_dev_native(self, monkeypatch):
        if dev_kernels.is_cutile_available() or not dev_kernels._TRITON_AVAILABLE:
            pytest.skip("cuTile runs here (it keeps precedence) or Triton is off")
        calls = []
        real = _fork_kernels().h_aggregate_backward
        monkeypatch.setattr(
            _fork_kernels(), "h_aggregate_backward", lambda *a: calls.append(1) or real(*a)
        )
        x, h_pre, grad = _streams(512, 2, 4, 1024, torch.bfloat16, "cuda", seed=3)
        xf, hf = x.clone().requires_grad_(True), h_pre.clone().requires_grad_(True)
        dev_kernels.fused_h_aggregate(xf, hf).backward(grad)
        assert calls, "dev's fused aggregation backward did not run the fork's kernel"
        rx, rh = dev_kernels._torch_h_aggregate_bwd(grad, x, h_pre)
        torch.testing.assert_close(xf.grad, rx, atol=BWD_TOL, rtol=BWD_TOL)
        torch.testing.assert_close(hf.grad, rh, atol=BWD_TOL, rtol=BWD_TOL)

    @pytest.mark.parametrize("schedule", ["fused", "split"])
    @pytest.mark.parametrize("T,C", [(4096, 1024), (1000, 4096)])
    def test_projection_op_runs_the_fork_kernel_and_matches_dev_native(self, monkeypatch, T, C, schedule):
        """dev's public fused_proj_rms_compute_h at real widths (K = 4 * hidden up to 16384, a
        token count not a multiple of the blocks): the fork's kernel runs and meets dev's fused
        tolerances against dev's native function, outputs and every gradient, with either
        backward schedule."""
        if dev_kernels.is_cutile_available() or not dev_kernels._TRITON_AVAILABLE:
            pytest.skip("cuTile runs here (it keeps precedence) or Triton is off")
        fk = _fork_kernels()
        ran = _use_schedule(monkeypatch, schedule, chunk=None)
        calls, real = [], fk.proj_rms_compute_h
        monkeypatch.setattr(fk, "proj_rms_compute_h", lambda *a: calls.append(1) or real(*a))
        x, w, alphas, bias, grads = _proj_inputs(T, 4, C, torch.bfloat16, "cuda", seed=C, zero_row=3)
        got = _run_proj(dev_kernels.fused_proj_rms_compute_h, x, w, alphas, bias, 4, grads)
        assert calls == [1], "dev's fused_proj_rms_compute_h did not run the fork's kernel"
        assert ran == [schedule], ran
        ref = _run_proj(dev_kernels._torch_proj_rms_compute_h, x, w, alphas, bias, 4, grads)
        for a, b in zip(got[0] + got[1], ref[0] + ref[1]):
            assert a.dtype == b.dtype and a.shape == b.shape
        for a, b in zip(got[0], ref[0]):
            torch.testing.assert_close(a, b, atol=FWD_TOL, rtol=FWD_TOL)
        for a, b in zip(got[1], ref[1]):
            torch.testing.assert_close(a, b, atol=BWD_TOL, rtol=BWD_TOL)

    def test_hyper_connection_module_fused_matches_native(self):
        """A whole dev HyperConnectionModule: fused (with the fork kernels: the aggregation
        backward and the projection) against dev's native path."""
        from megatron.core.transformer import TransformerConfig
        from megatron.core.transformer.hyper_connection import HyperConnectionModule
        from tests.unit_tests.test_utilities import Utils

        Utils.initialize_model_parallel(1, 1)
        try:
            kw = dict(num_layers=2, hidden_size=256, num_attention_heads=4, enable_hyper_connections=True,
                      num_residual_streams=4, bf16=True, params_dtype=torch.bfloat16)  # fmt: skip
            torch.manual_seed(0)
            native = HyperConnectionModule(TransformerConfig(**kw), layer_number=1).cuda()
            fused = HyperConnectionModule(TransformerConfig(use_fused_mhc=True, **kw), layer_number=1).cuda()
            fused.load_state_dict(native.state_dict())
            x = torch.randn(64, 2, 4 * 256, device="cuda", dtype=torch.bfloat16)
            outs = []
            for module in (native, fused):
                xi = x.clone().requires_grad_(True)
                h_pre, h_post, h_res = module.compute_mappings(xi)
                u = module.aggregate(xi, h_pre)
                (u.float().square().sum() + h_post.float().sum() + h_res.float().square().sum()).backward()
                outs.append((u.detach(), xi.grad, module.mapping_proj.weight.grad))
            for got, ref in zip(outs[1], outs[0]):
                torch.testing.assert_close(got.float(), ref.float(), atol=BWD_TOL, rtol=BWD_TOL)
        finally:
            Utils.destroy_model_parallel()
