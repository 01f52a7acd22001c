"""With mHC the MTP layer projects ``[enorm(emb), hnorm(x_j)]`` for each of the n streams. The
embedding half of that GEMM is the same for every stream, so it is computed once and added to
each stream's half: same result as the module path, without the ``[s, b*n, 2h]`` concat (whose
embedding half is n copies) or its share of the GEMM. Anything that could make the module do
more than ``x @ W^T`` (hooks, an override, fp8/fp4, a bias, a TP shard, deferred wgrad) keeps
the module path.
"""

import pytest
import torch

from megatron.core.transformer import mhc_multistream
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import BATCH, SEQ, build_gpt
from tests.unit_tests.test_utilities import Utils
from tests.unit_tests.transformer.test_hyper_connection import N, mhc_mtp_config


def _mtp_layer():
    torch.manual_seed(0)
    cfg = mhc_mtp_config()
    return build_gpt(cfg).mtp.layers[0], cfg


def _inputs(cfg, seed=1):
    gen = torch.Generator().manual_seed(seed)
    h = cfg.hidden_size
    multistream = torch.randn(SEQ, BATCH, N * h, generator=gen).requires_grad_()
    decoder_input = torch.randn(SEQ, BATCH, h, generator=gen).requires_grad_()
    return multistream, decoder_input


def _run(layer, cfg, grad_seed=2):
    """Projected streams and the grads of the inputs and of eh_proj's weight."""
    multistream, decoder_input = _inputs(cfg)
    out = layer._concat_embeddings(multistream, decoder_input)
    gen = torch.Generator().manual_seed(grad_seed)
    out.backward(torch.randn(out.shape, generator=gen))
    grads = (multistream.grad, decoder_input.grad, layer.eh_proj.weight.grad.clone())
    layer.eh_proj.weight.grad = None
    return out.detach(), grads


class TestMtpProjectionInHalves:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_no_stream_wide_concat_is_built(self):
        layer, cfg = _mtp_layer()
        multistream, decoder_input = _inputs(cfg)
        saved = []

        def pack(t):
            saved.append(tuple(t.shape))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = layer._concat_embeddings(multistream, decoder_input)
        h = cfg.hidden_size
        assert out.shape == (SEQ, BATCH, N * h)
        assert saved, "nothing was saved for backward"
        wide = [s for s in saved if s[-1] == 2 * h and len(s) == 3]
        assert wide == [], f"a [s, b*n, 2h] input was kept for backward: {wide}"

    def test_same_result_and_grads_as_the_module_path(self):
        layer, cfg = _mtp_layer()
        halves, halves_grads = _run(layer, cfg)
        calls = []
        handle = layer.eh_proj.register_forward_hook(lambda mod, args, out: calls.append(args[0].shape))
        try:
            module, module_grads = _run(layer, cfg)
        finally:
            handle.remove()
        h = cfg.hidden_size
        assert calls == [torch.Size([SEQ, BATCH * N, 2 * h])], calls  # the hook saw the module path
        torch.testing.assert_close(halves, module, rtol=1e-5, atol=1e-5)
        for got, want, name in zip(halves_grads, module_grads, ("multistream", "decoder_input", "weight")):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=name)

    def test_an_adapter_hook_is_honoured(self):
        layer, cfg = _mtp_layer()
        plain, _ = _run(layer, cfg)

        def adapter(mod, args, out):
            return (out[0] + 1.0, out[1])

        handle = layer.eh_proj.register_forward_hook(adapter)
        try:
            adapted, _ = _run(layer, cfg)
        finally:
            handle.remove()
        torch.testing.assert_close(adapted, plain + 1.0, rtol=1e-5, atol=1e-5)

    def test_plain_layer_projects_in_halves(self):
        layer, _ = _mtp_layer()
        assert mhc_multistream._projects_in_halves(layer)
        layer.eh_proj.bias = torch.nn.Parameter(torch.zeros(0))  # TE's stand-in for no bias
        assert mhc_multistream._projects_in_halves(layer)

    @pytest.mark.parametrize(
        "disqualify",
        [
            "fp8", "fp4", "delay_wgrad", "bias", "tp_shard", "quantized_weight", "patched_forward",
            "forward_hook", "forward_pre_hook", "backward_hook", "wrapper",
        ],
    )  # fmt: skip
    def test_anything_more_than_a_plain_gemm_keeps_the_module(self, disqualify, monkeypatch):
        layer, cfg = _mtp_layer()
        proj, h = layer.eh_proj, cfg.hidden_size
        if disqualify == "fp8":
            monkeypatch.setattr(layer.config, "fp8", "e4m3")
        elif disqualify == "fp4":
            monkeypatch.setattr(layer.config, "fp4", "e2m1")
        elif disqualify == "delay_wgrad":
            monkeypatch.setattr(layer.config, "delay_wgrad_compute", True)
        elif disqualify == "bias":
            proj.bias = torch.nn.Parameter(torch.zeros(1))  # any bias, even of one element
        elif disqualify == "tp_shard":
            proj.weight = torch.nn.Parameter(proj.weight.detach()[: h // 2].clone())
        elif disqualify == "quantized_weight":

            class Quantized(torch.Tensor):
                pass

            proj.weight = torch.nn.Parameter(proj.weight.detach().clone().as_subclass(Quantized))
        elif disqualify == "patched_forward":
            proj.forward = lambda x: type(proj).forward(proj, x)
        elif disqualify == "forward_hook":
            proj.register_forward_hook(lambda *a: None)
        elif disqualify == "forward_pre_hook":
            proj.register_forward_pre_hook(lambda *a: None)
        elif disqualify == "backward_hook":
            proj.register_full_backward_hook(lambda *a: None)
        elif disqualify == "wrapper":

            class Adapter(torch.nn.Module):
                def __init__(self, inner):
                    super().__init__()
                    self.inner, self.weight = inner, inner.weight

                def forward(self, x):
                    return self.inner(x)

            layer.eh_proj = Adapter(proj)
        assert not mhc_multistream._projects_in_halves(layer)


def _assert_close_to_scale(got, want, tol, what):
    err = (got.double() - want.double()).abs().max().item()
    scale = want.double().abs().max().item()
    assert scale > 0 and err <= tol * scale, f"{what}: max error {err:.3g} > {tol} x max |value| {scale:.3g}"


@pytest.mark.gpu
class TestMtpProjectionInHalvesWithTE:  # run on the H200 with Transformer Engine
    def setup_method(self, method):
        if not torch.cuda.is_available():
            pytest.skip("needs CUDA")
        pytest.importorskip("transformer_engine")
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    # TE runs fp32 GEMMs in TF32 on this GPU (the module path; the halves use torch's fp32 GEMMs),
    # so errors are judged against each tensor's largest value: on the H200 the weight gradient
    # (a sum over every token) differs by ~3e-4 of it in fp32; a wrong split is off by O(1).
    @pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-3), (torch.bfloat16, 2e-2)])
    def test_te_eh_proj_is_projected_in_halves_with_the_module_result(self, dtype, tol):
        from tests.unit_tests.transformer.test_hyper_connection_te import _build

        torch.manual_seed(0)
        cfg = mhc_mtp_config(use_cpu_initialization=True, params_dtype=dtype, bf16=dtype == torch.bfloat16)
        layer = _build(cfg, te=True).to(dtype).mtp.layers[0]
        assert type(layer.eh_proj).__name__ == "TEColumnParallelLinear"
        assert mhc_multistream._projects_in_halves(layer)
        multistream, decoder_input = (t.detach().cuda().to(dtype).requires_grad_() for t in _inputs(cfg))
        halves = layer._concat_embeddings(multistream, decoder_input)
        handle = layer.eh_proj.register_forward_hook(lambda *a: None)  # forces the module path
        try:
            module = layer._concat_embeddings(multistream, decoder_input)
        finally:
            handle.remove()
        _assert_close_to_scale(halves, module, tol, "output")
        gen = torch.Generator().manual_seed(2)
        grad = torch.randn(halves.shape, generator=gen).cuda().to(dtype)
        got = torch.autograd.grad(halves, (multistream, decoder_input, layer.eh_proj.weight), grad)
        want = torch.autograd.grad(module, (multistream, decoder_input, layer.eh_proj.weight), grad)
        for name, g, w in zip(("d streams", "d embedding", "d weight"), got, want):
            _assert_close_to_scale(g, w, tol, name)
