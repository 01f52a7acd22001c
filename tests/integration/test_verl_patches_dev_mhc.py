"""verl 0.9.1's Megatron patches on upstream dev's mHC with MTP (the upstream-dev line only).

The seed crashes came from two verl patches meeting mHC + MTP: a replaced ``GPTModel._postprocess``
that did not hand the decoder's ``[s, b, n*h]`` multistream to the MTP block (a reshape crash
inside the MTP layer), and a replaced ``CheckpointFunction.backward`` that frees every checkpoint
input's storage (``untyped_storage().resize_(0)``) although the MTP layer's input is a view of the
decoder's multistream, which the decoder's output contraction still reads in its backward.

On this line: verl's ``patch_postprocess`` runs (same logits, the MTP layer trains), ``compute_mtp``
is refused by name; a copy that drops the multistream fails with an error naming it; verl's
recompute backward gives the gradients of the unpatched backward and never frees the multistream.

Three setups: local (non-TE) specs with ``use_fused_mhc=False`` (on the CUDA device where there is
one, else the CPU); on a GPU, local specs and dev's Transformer Engine spec, both with
``use_fused_mhc=True`` (dev's Triton kernels); the GPU setups skip on CPU, the TE one also without
Transformer Engine. Skips where dev's mHC is absent (the release and upstream-main lines) or
verl is not installed (tests/integration/install_clients.sh).
"""

import pytest
import torch

from megatron.core import fork_compat
from megatron.core.transformer import hyper_connection
from tests.integration.clients import verl_module
from tests.unit_tests import cpu_compat

pytestmark = [
    pytest.mark.skipif(
        not hasattr(hyper_connection, "learned_output_contract"), reason="no upstream dev mHC on this base"
    ),
    pytest.mark.usefixtures("harness"),
]

def _have_te():
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:
        return False
    return True


_NO_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="dev's fused mHC needs a GPU")
SETUPS = [
    pytest.param("unfused", id="local-unfused"),
    pytest.param("gpu", id="local-fused-gpu", marks=[_NO_GPU, pytest.mark.gpu]),
    pytest.param(
        "te",
        id="te-fused-gpu",
        marks=[
            _NO_GPU,
            pytest.mark.gpu,
            pytest.mark.skipif(not _have_te(), reason="needs Transformer Engine"),
        ],
    ),
]
RECOMPUTE = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)


@pytest.fixture(autouse=True)
def _cpu_streams(monkeypatch):
    """dev's mHC opens NVTX ranges (cpu_compat's stand-in without CUDA), and verl's backward hands
    each freed tensor to ``record_stream``, which a CPU tensor does not take: nothing to order."""
    cpu_compat.install()
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)


def _model(setup, **overrides):
    from tests.unit_tests.transformer.test_dev_mhc_multistream import dev_mhc_mtp_model

    return dev_mhc_mtp_model(te=setup == "te", use_fused_mhc=setup != "unfused", **overrides)


def _batch(setup):
    from tests.unit_tests.transformer.test_dev_mhc_multistream import dev_batch

    return dev_batch()  # every setup runs on the device of dev_batch / dev_mhc_mtp_model


def _assert_same_grads(grads, expected):
    """Bit-equal on the CPU; on a GPU within float32 rounding, since kernels may reduce in
    another order between runs (a backward that read freed storage is off by far more)."""
    exact = not torch.cuda.is_available()
    for name in expected:
        torch.testing.assert_close(
            grads[name], expected[name], rtol=0 if exact else 1e-4, atol=0 if exact else 1e-6, msg=name
        )


@pytest.mark.parametrize("setup", SETUPS)
def test_patch_postprocess_runs_and_refuses_compute_mtp_false(setup):
    mtp_patch = verl_module("verl.models.mcore.mtp_patch")
    model = _model(setup)
    tokens, positions, mask = _batch(setup)
    logits = model(tokens, positions, mask)

    mtp_patch.patch_postprocess(model)  # what verl does with mtp.enable
    assert torch.equal(model(tokens, positions, mask), logits)
    with_labels = model(tokens, positions, mask, labels=tokens)  # verl: logits, MTP loss attached
    assert torch.equal(with_labels, logits)
    with_labels.float().logsumexp(-1).sum().backward()
    assert model.mtp.layers[0].h_proj.weight.grad is not None, "the MTP loss trains the MTP layer"
    assert model.mtp.layers[0].h_proj.weight.grad.abs().sum() > 0

    with pytest.raises(RuntimeError, match=r"GPTModel\._postprocess was replaced by verl\."):
        model(tokens, positions, mask, compute_mtp=False)
    (item,) = fork_compat.replaced(model)
    assert item.replacement == "verl.models.mcore.mtp_patch._megatron_gptmodel_postprocess"


@pytest.mark.parametrize("setup", SETUPS)
def test_a_postprocess_that_drops_the_multistream_is_a_named_error(setup):
    """verl's own function called the way a copy written before dev's contract calls it."""
    mtp_patch = verl_module("verl.models.mcore.mtp_patch")
    model = _model(setup)
    tokens, positions, mask = _batch(setup)

    def older(*args, mhc_multistream=None, **kwargs):
        return mtp_patch._megatron_gptmodel_postprocess(model, *args, **kwargs)

    model._postprocess = older
    with pytest.raises(ValueError, match="mhc_multistream") as err:
        model(tokens, positions, mask, labels=tokens)
    assert "MultiTokenPredictionBlock.forward" in str(err.value)


def _recompute_step(model, setup):
    """One training step under full recompute; (grads, multistream, MTP layer input, chunk inputs)."""
    seen, chunk_inputs = {}, {}

    def keep(store, key, value):  # the first forward's tensors (recompute runs the hooks again)
        store.setdefault(key, value)  # a forward pre-hook must return None

    model.mtp.register_forward_pre_hook(
        lambda m, a, kw: keep(seen, "multistream", kw["mhc_multistream"]), with_kwargs=True
    )
    model.mtp.layers[0].register_forward_pre_hook(
        lambda m, a, kw: keep(seen, "mtp_input", kw["hidden_states"]), with_kwargs=True
    )
    for idx, layer in enumerate(model.decoder.layers):
        layer.register_forward_pre_hook(
            lambda m, a, kw, idx=idx: keep(chunk_inputs, idx, kw["hidden_states"]), with_kwargs=True
        )
    model.train()
    tokens, positions, mask = _batch(setup)
    model(tokens, positions, mask, labels=tokens).mean().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return grads, seen["multistream"], seen["mtp_input"], chunk_inputs


@pytest.mark.parametrize("setup", SETUPS)
def test_recompute_backward_never_frees_the_multistream(setup):
    patch = verl_module("verl.models.mcore.patch")
    reference = _model(setup, **RECOMPUTE)
    expected, _, _, _ = _recompute_step(reference, setup)

    patch.apply_patch_megatron_recomputation_backward()  # verl applies it on every CUDA run
    model = _model(setup, **RECOMPUTE)
    model.load_state_dict(reference.state_dict())
    grads, multistream, mtp_input, chunk_inputs = _recompute_step(model, setup)

    # The hazard is there: the MTP layer's checkpoint input shares the multistream's storage,
    # and verl's backward did free checkpoint inputs (the decoder's second chunk's).
    assert mtp_input.untyped_storage().data_ptr() == multistream.untyped_storage().data_ptr()
    assert chunk_inputs[1].untyped_storage().nbytes() == 0, "verl's backward frees chunk inputs"
    assert multistream.untyped_storage().nbytes() > 0, "the multistream must never be freed"
    assert grads.keys() == expected.keys()
    assert any(name.startswith("mtp.") for name in grads)
    _assert_same_grads(grads, expected)
