"""The fork's Triton kernel as upstream dev's mHC aggregation backward (upstream-dev line only).

On the upstream-dev line, ``mhc-fused-kernels`` gives dev's ``use_fused_mhc`` path a Triton
backward of ``u = sum_j H_pre[j] x_j`` where dev has only native torch (no working cuTile), in
``megatron/core/transformer/hyper_connection_fused.py`` (on this line only that kernel). These
tests hold it to dev's own native function, which is its reference: on CPU in Triton's
interpreter, on a GPU through dev's public fused op and through a whole HyperConnectionModule.
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


class TestBackendSelection:
    def test_status_names_triton_for_the_aggregation_backward(self):
        """Where Triton imports and cuTile does not run, dev's status names Triton, not native."""
        if not dev_kernels._TRITON_AVAILABLE or dev_kernels.is_cutile_available():
            pytest.skip("needs Triton importable and cuTile not running")
        message, _ = dev_kernels._mhc_backend_status()
        assert "h_aggregate=fwd:triton,bwd:triton" in message, message

    def test_forced_native_backend_keeps_dev_native_backward(self, monkeypatch):
        """MHC_FORCE_BACKEND=native (dev's switch) leaves the fork's kernel out."""
        monkeypatch.setattr(dev_kernels, "_TRITON_AVAILABLE", False)
        monkeypatch.setattr(dev_kernels, "_CUTILE_AVAILABLE", False)
        message, _ = dev_kernels._mhc_backend_status()
        assert "bwd:native" in message, message

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


@interpreter_parent
def test_interpreter_suite_in_subprocess():
    """Run TestAggregateBackwardInterpreter under TRITON_INTERPRET=1 in a fresh interpreter."""
    assert_interpreter_suite_passes(__file__, "TestAggregateBackwardInterpreter", timeout=600)


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

    def test_hyper_connection_module_fused_matches_native(self):
        """A whole dev HyperConnectionModule: fused (with the fork kernel) against dev's native path."""
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
