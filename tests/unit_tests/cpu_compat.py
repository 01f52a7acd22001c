"""A small, explicit CUDA stand-in so Megatron-core's unit tests run on CPU (gloo).

Megatron-core assumes CUDA in a few corners that have nothing to do with what the tests check:
the global memory buffer asks ``torch.cuda.current_device()`` for its device, and the model-parallel
RNG tracker snapshots and restores CUDA generator states. On a machine without CUDA we point the
device at the CPU and keep the "CUDA" generator state in a separate CPU generator, so forking the
tracker neither fails nor disturbs the CPU stream. The pipeline schedules allocate their token
counter with ``device="cuda"``; in that module alone such tensors are made on the CPU. Nothing here is
installed when CUDA is present.

Where the bases differ (upstream ``main``), two more corners: ``is_inference_column_parallel_linear``
(called when an MTP layer is built) tests ``isinstance`` against Transformer Engine classes, which are
not types without Transformer Engine; and upstream's own mHC layer opens ``torch.cuda.nvtx`` ranges,
which raise without CUDA. Both get no-op stand-ins, only when the name exists. Upstream ``dev``'s
point-to-point pipeline communication asks ``torch.cuda.is_current_stream_capturing()`` after a
batched send/receive; a CPU-only torch raises there, and without CUDA no stream can be capturing,
so the stand-in answers False.
"""

import torch

_installed = False
_fake_cuda_generator = torch.Generator()


def _get_state(*_args, **_kwargs):
    return _fake_cuda_generator.get_state()


def _set_state(state, *_args, **_kwargs):
    _fake_cuda_generator.set_state(state)


def _manual_seed(seed):
    _fake_cuda_generator.manual_seed(int(seed))


class _ScheduleTorch:
    """``torch`` as the pipeline schedules see it: a tensor they ask for on "cuda" is made on the CPU."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def zeros(*args, device=None, **kwargs):
        return torch.zeros(*args, device="cpu" if device == "cuda" else device, **kwargs)


def install() -> bool:
    """Install the stand-ins when CUDA is unavailable; return whether they are active."""
    global _installed
    if torch.cuda.is_available():
        return False
    if _installed:
        return True
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.get_rng_state = _get_state
    torch.cuda.set_rng_state = _set_state
    torch.cuda.manual_seed = _manual_seed
    torch.cuda.manual_seed_all = _manual_seed
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.is_current_stream_capturing = lambda: False
    from megatron.core.tensor_parallel import random as mp_random

    mp_random._get_cuda_rng_state = _get_state
    mp_random._set_cuda_rng_state = _set_state
    from megatron.core.pipeline_parallel import schedules

    schedules.torch = _ScheduleTorch()
    _install_without_te_inference_linear_check()
    _install_nvtx_stand_in()
    _installed = True
    return True


def _install_without_te_inference_linear_check() -> None:
    try:
        from megatron.core.tensor_parallel import inference_layers
    except ImportError:
        return
    if not hasattr(inference_layers, "is_inference_column_parallel_linear"):
        return  # a base without it (megatron-core 0.19)
    names = ("InferenceColumnParallelLinear", "InferenceLayerNormColumnParallelLinear")
    kinds = tuple(k for k in (getattr(inference_layers, n, None) for n in names) if isinstance(k, type))
    if len(kinds) == len(names):
        return  # Transformer Engine present: the real check works

    def is_inference_column_parallel_linear(module) -> bool:
        return bool(kinds) and isinstance(module, kinds)

    inference_layers.is_inference_column_parallel_linear = is_inference_column_parallel_linear
    from megatron.core.transformer import multi_token_prediction

    if hasattr(multi_token_prediction, "is_inference_column_parallel_linear"):
        multi_token_prediction.is_inference_column_parallel_linear = is_inference_column_parallel_linear


class _NoNvtx:
    """``torch.cuda.nvtx`` without CUDA: ranges and marks that record nothing."""

    @staticmethod
    def range_push(*_args, **_kwargs):
        return 0

    @staticmethod
    def range_pop(*_args, **_kwargs):
        return 0

    @staticmethod
    def mark(*_args, **_kwargs):
        return None

    @staticmethod
    def range(*_args, **_kwargs):
        import contextlib

        return contextlib.nullcontext()


def _install_nvtx_stand_in() -> None:
    try:
        from megatron.core.transformer import hyper_connection
    except ImportError:
        return
    if hasattr(hyper_connection, "HyperConnectionModule"):  # upstream's mHC (main) opens ranges
        torch.cuda.nvtx = _NoNvtx()
