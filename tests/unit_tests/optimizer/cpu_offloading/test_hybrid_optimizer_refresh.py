"""HybridDeviceOptimizer: weights loaded after the optimizer is built must survive the next step.

The optimizer offloads device ("GPU") parameters to CPU copies that the CPU optimizer steps and
writes back. ``update_fp32_param_by_new_param`` (what DistributedOptimizer calls to reload main
params from the model) must refresh every such copy, including those of parameters that are
already fp32 and so have no separate fp32 master.

With CUDA the parameters are real device tensors. Without it, the test gives the optimizer what it
needs to treat parameters as device-resident: parameters report ``is_cuda`` (a tensor subclass),
pinning is a no-op, and CUDA streams/events are synchronous CPU stand-ins. The optimizer's own
logic runs unchanged either way.
"""

import pytest
import torch

from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer

LR = 0.5


class _DeviceTensor(torch.Tensor):
    """A tensor the optimizer takes for device memory. Like a CUDA tensor, ``.cpu()`` returns a
    new host tensor, and results of ops on it (``detach().clone().float()``) stay "on device"."""

    @property
    def is_cuda(self):
        return True

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor).clone()


class _Event:
    def synchronize(self):
        pass

    def wait(self, stream=None):
        pass


class _Stream:
    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, stream):
        pass

    def record_event(self, event=None):
        return _Event()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def to_device(monkeypatch):
    """Returns how to put a host tensor "on the device" (real CUDA, or the CPU stand-in)."""
    if torch.cuda.is_available():
        return lambda t: t.cuda()
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: _Stream())
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: stream)
    return lambda t: t.as_subclass(_DeviceTensor)


def _make_params(dtypes, to_device):
    torch.manual_seed(0)
    return [to_device(torch.randn(4, 3).to(dtype)).requires_grad_() for dtype in dtypes]


def _build(params, offload_fraction, param_update_in_fp32, overlap):
    return HybridDeviceOptimizer(
        params,
        offload_fraction=offload_fraction,
        cpu_optimizer_cls=torch.optim.SGD,
        gpu_optimizer_cls=torch.optim.SGD,
        param_update_in_fp32=param_update_in_fp32,
        pin_cpu_grads=False,
        pin_cpu_params=False,
        overlap_cpu_optimizer_d2h_h2d=overlap,
        lr=LR,
    )


class TestRefreshOffloadedCopies:
    @pytest.mark.parametrize("overlap", [True, False])
    @pytest.mark.parametrize("param_update_in_fp32", [True, False])
    @pytest.mark.parametrize("offload_fraction", [1.0, 0.5, 0.0])
    def test_loaded_weights_survive_step(
        self, to_device, offload_fraction, param_update_in_fp32, overlap
    ):
        dtypes = [torch.float32, torch.bfloat16, torch.float32, torch.bfloat16]
        params = _make_params(dtypes, to_device)
        opt = _build(params, offload_fraction, param_update_in_fp32, overlap)
        offloaded = set(map(id, opt.gpu_params_map_cpu_copy))
        expected_offloaded = {1.0: 4, 0.5: 2, 0.0: 0}[offload_fraction]
        assert len(offloaded) == expected_offloaded
        if offload_fraction > 0:
            assert id(params[0]) in offloaded  # an fp32 parameter is offloaded in every case

        # Load new weights into the model after the optimizer was built, then tell the optimizer.
        torch.manual_seed(1)
        loaded = [torch.randn(p.shape).to(p.dtype) for p in params]
        with torch.no_grad():
            for p, w in zip(params, loaded):
                p.copy_(to_device(w))
        opt.update_fp32_param_by_new_param()

        grads = [torch.randn(p.shape).to(p.dtype) for p in params]
        for p, g in zip(params, grads):
            p.grad = to_device(g.clone())
        opt.step()

        for i, (p, w, g) in enumerate(zip(params, loaded, grads)):
            expected = (w.float() - LR * g.float()).to(p.dtype)
            tol = dict(rtol=0, atol=0) if p.dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
            actual = p.detach().as_subclass(torch.Tensor).cpu()
            torch.testing.assert_close(
                actual, expected, **tol, msg=lambda m: f"param {i} ({p.dtype}): {m}"
            )

    def test_refresh_reaches_every_offloaded_copy(self, to_device):
        params = _make_params([torch.float32, torch.bfloat16], to_device)
        opt = _build(params, 1.0, True, False)
        with torch.no_grad():
            for p in params:
                p.fill_(3.0)
        opt.update_fp32_param_by_new_param()
        for p in params:
            copy = opt.param_to_inner_param[p]
            assert copy is not p and copy.dtype == torch.float32 and not copy.is_cuda
            assert torch.equal(copy, torch.full_like(copy, 3.0))
