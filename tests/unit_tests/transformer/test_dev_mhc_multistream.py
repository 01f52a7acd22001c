"""On upstream dev's mHC (the upstream-dev line): a postprocess that drops the MTP multistream.

dev's GPTModel hands the decoder's ``[s, b, n*h]`` multistream to the MTP block through
``_postprocess(..., mhc_multistream=...)``. An RL framework's replacement of ``_postprocess`` that
takes the argument but does not forward it (the seed crash) used to reach the MTP layer with the
contracted ``[s, b, h]`` and fail in a reshape; patch mhc-mtp-multistream makes it a ValueError
that names the missing argument. On a base without dev's mHC the tests skip.
"""

import pytest
import torch

from megatron.core.transformer import hyper_connection
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import SEQ, VOCAB, causal_batch
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import tiny_moe_mtp_config
from tests.unit_tests.test_utilities import Utils, unit_device

# dev's module has the learned output contraction; the release line's (fork) mHC and upstream
# main's do not (the release line accepts dev's config names as aliases, so no config check).
pytestmark = pytest.mark.skipif(
    not hasattr(hyper_connection, "learned_output_contract"), reason="no upstream dev mHC on this base"
)
N = 2


def dev_batch(seed=0):
    """``causal_batch``: tokens, positions and mask drawn on the CPU, on ``unit_device()``."""
    return causal_batch(seed)


def dev_mhc_mtp_model(te=False, **overrides):
    """A tiny dense GPT with dev's mHC layers and one MTP layer: local spec, or with ``te``
    dev's Transformer Engine spec (its HyperConnectionTransformerLayer over TE linears).
    Initialised on the CPU (``tiny_moe_mtp_config`` sets use_cpu_initialization), then moved to
    ``unit_device()``, where Megatron's buffers live on a CUDA host."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
        get_gpt_mtp_block_spec,
    )

    values = dict(
        enable_hyper_connections=True,
        num_residual_streams=N,
        num_moe_experts=None,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    values.update(overrides)
    config = tiny_moe_mtp_config(**values)
    make_spec = get_gpt_layer_with_transformer_engine_spec if te else get_gpt_layer_local_spec
    spec = make_spec(enable_hyper_connection=True)
    mtp_spec = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=te)
    torch.manual_seed(0)
    model = GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=SEQ, mtp_block_spec=mtp_spec)
    return model.to(unit_device())


def drop_multistream(model):
    """Replace ``_postprocess`` on the instance by one that swallows ``mhc_multistream`` (a
    framework's copy written before dev's contract, taking extra keywords)."""
    original = model._postprocess

    def postprocess(*args, mhc_multistream=None, **kwargs):
        return original(*args, **kwargs)

    model._postprocess = postprocess


class TestDroppedMultistream:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def _expect_named_error(self, model):
        tokens, position_ids, mask = dev_batch()
        drop_multistream(model)
        with pytest.raises(ValueError, match="mhc_multistream") as err:
            model(tokens, position_ids, mask, labels=tokens)
        assert "MultiTokenPredictionBlock.forward" in str(err.value)
        assert "got None" in str(err.value)

    def test_postprocess_without_the_multistream_is_a_clear_error(self):
        self._expect_named_error(dev_mhc_mtp_model(use_fused_mhc=False))

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="dev's fused mHC needs a Triton GPU driver")
    def test_fused_postprocess_without_the_multistream_is_a_clear_error(self):
        self._expect_named_error(dev_mhc_mtp_model(use_fused_mhc=True))

    def test_wrong_width_is_a_clear_error(self):
        model = dev_mhc_mtp_model()
        hidden = torch.zeros(SEQ, 2, model.config.hidden_size, device=unit_device())
        tokens, position_ids, mask = dev_batch()
        with pytest.raises(ValueError, match=r"mhc_multistream must be \[s, b, 64\]"):
            model.mtp(
                input_ids=tokens,
                position_ids=position_ids,
                hidden_states=hidden,
                attention_mask=mask,
                embedding=model.embedding,
                mhc_multistream=hidden,
            )


class TestReplacedPostprocessSignature:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_a_replacement_without_the_argument_is_named(self):
        # A framework's _postprocess copied from a release before dev's contract has no
        # mhc_multistream parameter: the model names the replacement instead of a TypeError.
        model = dev_mhc_mtp_model()
        original = model._postprocess

        def older_postprocess(
            hidden_states, input_ids, position_ids, labels, rotary_pos_emb, rotary_pos_cos,
            rotary_pos_sin, mtp_in_postprocess=None, loss_mask=None, decoder_input=None,
            attention_mask=None, padding_mask=None, inference_params=None, packed_seq_params=None,
            sequence_len_offset=None, runtime_gather_output=None, extra_block_kwargs=None,
            inference_context=None, output_processor=None, output_processor_context=None,
        ):
            raise AssertionError("must not be called with the multistream dropped")

        model._postprocess = older_postprocess
        tokens, position_ids, mask = dev_batch()
        with pytest.raises(RuntimeError, match="takes no mhc_multistream") as err:
            model(tokens, position_ids, mask, labels=tokens)
        assert "older_postprocess" in str(err.value)
        model._postprocess = original


class TestSpeculativeDecoding:
    def test_engine_check_refuses_speculative_tokens_only(self):
        from megatron.core.transformer.mhc_multistream import refuse_mtp_speculative_decoding

        config = tiny_moe_mtp_config(
            enable_hyper_connections=True, num_residual_streams=N, num_moe_experts=None
        )
        refuse_mtp_speculative_decoding(config, 0, "DynamicInferenceEngine")  # no drafting: fine
        with pytest.raises(ValueError, match="num_speculative_tokens=2"):
            refuse_mtp_speculative_decoding(config, 2, "DynamicInferenceEngine")
