"""On upstream dev's mHC (the upstream-dev line): what the fork's patches add to dev's mHC.

- Pipeline-parallel inference: an mHC stage sends its n residual streams, so the receive buffer
  of the inference wrapper is ``[s, b, n*h]`` (patch mhc-pipeline-parallel).
- Reclaiming checkpoint inputs under full recompute (patch recompute-reclaim-declared-inputs):
  the MTP layer's input is a view of the decoder's multistream, which the decoder's contraction
  backward still reads; reclaim must never free it, and gradients equal those without reclaim.

On a base without dev's mHC the tests skip.
"""

import types

import pytest
import torch

from megatron.core.transformer import hyper_connection
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import tiny_moe_mtp_config
from tests.unit_tests.test_utilities import Utils
from tests.unit_tests.transformer.test_dev_mhc_multistream import N, dev_batch, dev_mhc_mtp_model

# dev's module has the learned output contraction; the release line's (fork) mHC and upstream
# main's do not (the release line accepts dev's config names as aliases, so no config check).
pytestmark = pytest.mark.skipif(
    not hasattr(hyper_connection, "learned_output_contract"), reason="no upstream dev mHC on this base"
)


class TestPipelineInference:
    def test_recv_buffer_carries_the_streams(self):
        from megatron.core.inference.model_inference_wrappers.abstract_model_inference_wrapper import (  # noqa: E501
            AbstractModelInferenceWrapper,
        )

        def buffer(**mhc):
            config = tiny_moe_mtp_config(num_moe_experts=None, **mhc)
            wrapper = types.SimpleNamespace(
                config=config, sequence_parallel=False, pipeline_communication_dtype=torch.float32
            )
            return AbstractModelInferenceWrapper._allocate_recv_buffer(wrapper, 3, 5)

        assert tuple(buffer().shape) == (5, 3, 32)
        streams = buffer(enable_hyper_connections=True, num_residual_streams=N)
        assert tuple(streams.shape) == (5, 3, N * 32)


RECOMPUTE = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)


class TestReclaimWithDevMHC:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def _run(self, reclaim, state=None):
        model = dev_mhc_mtp_model(recompute_reclaim_inputs=reclaim, **RECOMPUTE)
        if state is not None:
            model.load_state_dict(state)
        chunk_inputs, mtp_seen = {}, {}

        def keep(store, key, value):  # a forward pre-hook must return None
            store.setdefault(key, value)

        for idx, layer in enumerate(model.decoder.layers):
            layer.register_forward_pre_hook(
                lambda m, a, kw, idx=idx: keep(chunk_inputs, idx, kw["hidden_states"]),
                with_kwargs=True,
            )
        model.mtp.register_forward_pre_hook(
            lambda m, a, kw: keep(mtp_seen, "mhc_multistream", kw["mhc_multistream"]),
            with_kwargs=True,
        )
        model.mtp.layers[0].register_forward_pre_hook(
            lambda m, a, kw: keep(mtp_seen, "layer_input", kw["hidden_states"]), with_kwargs=True
        )
        tokens, position_ids, mask = dev_batch()
        model(tokens, position_ids, mask, labels=tokens).mean().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return model, grads, chunk_inputs, mtp_seen

    def test_full_recompute_reclaim_never_frees_the_mtp_multistream(self):
        off, g_off, _, _ = self._run(False)
        _, g_on, chunk_inputs, mtp_seen = self._run(True, state=off.state_dict())
        multistream = mtp_seen["mhc_multistream"]
        # the hazard is real: the MTP layer's input shares the multistream's storage
        assert (
            mtp_seen["layer_input"].untyped_storage().data_ptr()
            == multistream.untyped_storage().data_ptr()
        )
        assert multistream.untyped_storage().nbytes() > 0, "the multistream must not be freed"
        assert chunk_inputs[1].untyped_storage().nbytes() == 0, "chunk 1's input must be reclaimed"
        assert g_off.keys() == g_on.keys()
        assert any(name.startswith("mtp.") for name in g_on), "the MTP layer must get gradients"
        for name in g_off:
            torch.testing.assert_close(g_on[name], g_off[name], rtol=0, atol=0, msg=name)


class TestPostSublayerNorms:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_dev_mhc_layer_refuses_the_norms(self):
        # dev's mHC layer overrides the methods that apply the post-sublayer norms (patch
        # post-sublayer-layernorm): it must refuse them, not build norms it never applies.
        for flags in (dict(post_self_attn_layernorm=True), dict(post_mlp_layernorm=True)):
            with pytest.raises(ValueError, match="does not apply the post-sublayer norms"):
                dev_mhc_mtp_model(**flags)
        dev_mhc_mtp_model()  # without the flags the same model builds
