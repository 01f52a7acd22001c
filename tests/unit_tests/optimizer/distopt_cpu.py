"""Test-only shim that lets Megatron's DistributedOptimizer run on CPU ranks (gloo).

The optimizer itself is device agnostic, but a few places spell the device as the literal string
``'cuda'`` (scalar flags and loss-scale tensors) or recognise parameters by ``Tensor.type()`` names
such as ``'torch.cuda.FloatTensor'``. :func:`install` maps both onto CPU. It changes process-wide
behaviour, so call it only inside a spawned test rank (``run_distributed``), never in the pytest
process, and only where CUDA is absent.
"""

import functools

import torch

_FACTORIES = ("tensor", "zeros", "ones", "empty", "full")
_installed = False


def _cpu_if_cuda(device):
    if isinstance(device, str) and device.startswith("cuda"):
        return "cpu"
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


def _wrap_factory(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _cpu_if_cuda(kwargs["device"])
        return fn(*args, **kwargs)

    return wrapper


def install() -> bool:
    """Install the shim when CUDA is unavailable; return whether it is active."""
    global _installed
    if torch.cuda.is_available():
        return False
    if _installed:
        return True
    for name in _FACTORIES:
        setattr(torch, name, _wrap_factory(getattr(torch, name)))

    original_type = torch.Tensor.type

    def type_as_cuda(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None and not kwargs and self.device.type == "cpu":
            return original_type(self).replace("torch.", "torch.cuda.", 1)
        return original_type(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = type_as_cuda
    _installed = True
    return True
