"""HybridDeviceOptimizer: the device optimizer steps only after the side stream made its gradients.

With ``overlap_cpu_optimizer_d2h_h2d`` the optimizer prepares gradients on a side (d2h) stream:
the CPU copies of offloaded parameters, and with ``param_update_in_fp32`` the fp32 gradients of
the parameters that stay on the device (``param.grad.to(float32)``). The CPU optimizers wait for
that stream's event; the device optimizer used to step on the current stream at once, reading
fp32 gradients the side stream had not written yet (an H200 run of
``test_hybrid_optimizer_refresh.py`` saw a bf16 parameter move by 1.5 where the step was 0.5 x its
gradient).

On CPU the streams are recording stand-ins and the test checks the order of waits and steps; on
CUDA the second test checks the numbers on real streams, with tensors large enough for the race.
"""

import pytest
import torch

from tests.unit_tests.optimizer.cpu_offloading.test_hybrid_optimizer_refresh import (
    LR,
    _build,
    _DeviceTensor,
    _Stream,
)


class _Recorder:
    def __init__(self):
        self.events = []


class _RecordingStream(_Stream):
    """A synchronous CPU stream that logs which stream waited for which."""

    def __init__(self, name, recorder):
        self.name, self.recorder = name, recorder

    def wait_stream(self, stream):
        self.recorder.events.append(f"{self.name} waits for {stream.name}")


class TestDeviceStepWaitsForSideStream:
    @pytest.mark.parametrize("offload_fraction", [0.0, 0.5])
    def test_device_optimizer_steps_after_waiting_for_the_side_stream(self, monkeypatch, offload_fraction):
        recorder = _Recorder()
        current = _RecordingStream("current", recorder)
        monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: current)
        monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: _RecordingStream("side", recorder))
        monkeypatch.setattr(torch.cuda, "stream", lambda stream: stream)

        torch.manual_seed(0)
        params = [
            torch.randn(4, 3).to(dtype).as_subclass(_DeviceTensor).requires_grad_()
            for dtype in (torch.float32, torch.bfloat16, torch.float32, torch.bfloat16)
        ]
        opt = _build(params, offload_fraction, param_update_in_fp32=True, overlap=True)
        assert opt.gpu_optimizer is not None
        device_step = opt.gpu_optimizer.step

        def logged_step(*args, **kwargs):
            recorder.events.append("device optimizer steps")
            return device_step(*args, **kwargs)

        monkeypatch.setattr(opt.gpu_optimizer, "step", logged_step)
        for p in params:
            p.grad = torch.randn(p.shape).to(p.dtype).as_subclass(_DeviceTensor)
        recorder.events.clear()
        opt.step()

        events = recorder.events
        assert "device optimizer steps" in events, events
        stepped = events.index("device optimizer steps")
        assert "current waits for side" in events[:stepped], (
            f"the device optimizer stepped before the current stream waited for the side stream "
            f"that converts its fp32 gradients: {events}"
        )

    @pytest.mark.gpu
    def test_fp32_masters_step_with_the_gradients_given(self):
        torch.manual_seed(0)
        shape = (4096, 4096)  # large enough that the conversion is still running when SGD starts
        for trial in range(5):
            params = [torch.randn(shape, device="cuda").to(torch.bfloat16).requires_grad_() for _ in range(3)]
            opt = _build(params, 0.0, param_update_in_fp32=True, overlap=True)
            grads = [torch.randn(shape, device="cuda").to(torch.bfloat16) for _ in params]
            before = [p.detach().float().clone() for p in params]
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
            torch.cuda.synchronize()
            for i, (p, w, g) in enumerate(zip(params, before, grads)):
                expected = (w - LR * g.float()).to(torch.bfloat16)
                torch.testing.assert_close(
                    p.detach(), expected, rtol=1e-2, atol=1e-2,
                    msg=lambda m: f"trial {trial}, parameter {i}: {m}",
                )
