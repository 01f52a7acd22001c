"""``GPTModel._postprocess`` replaced by a framework (verl's ``patch_postprocess`` and the like).

Frameworks swap in their own ``_postprocess`` written against upstream's signature. The fork's
``forward`` must keep calling it with upstream's arguments, and a ``compute_mtp=False`` that the
replacement cannot take must be refused by name instead of silently running the MTP block.
"""

import types

import pytest
import torch

from megatron.core.models.gpt.gpt_model import GPTModel
from tests.unit_tests.test_utilities import Utils
from tests.unit_tests.transformer.mtp_testing import (
    build_model,
    causal_batch,
    deterministic_config,
    reset_mtp_state,
)

FORK_POSTPROCESS = GPTModel._postprocess


def upstream_signature_postprocess(
    self,
    hidden_states,
    input_ids,
    position_ids,
    labels,
    rotary_pos_emb,
    rotary_pos_cos,
    rotary_pos_sin,
    mtp_in_postprocess=None,
    loss_mask=None,
    decoder_input=None,
    attention_mask=None,
    padding_mask=None,
    inference_params=None,
    packed_seq_params=None,
    sequence_len_offset=None,
    runtime_gather_output=None,
    extra_block_kwargs=None,
    inference_context=None,
    output_processor=None,
    output_processor_context=None,
):
    """Takes exactly the parameters of megatron-core 0.19.2's ``_postprocess``."""
    self.foreign_calls += 1
    return FORK_POSTPROCESS(
        self,
        hidden_states,
        input_ids,
        position_ids,
        labels,
        rotary_pos_emb,
        rotary_pos_cos,
        rotary_pos_sin,
        mtp_in_postprocess=mtp_in_postprocess,
        loss_mask=loss_mask,
        decoder_input=decoder_input,
        attention_mask=attention_mask,
        padding_mask=padding_mask,
        inference_params=inference_params,
        packed_seq_params=packed_seq_params,
        sequence_len_offset=sequence_len_offset,
        runtime_gather_output=runtime_gather_output,
        extra_block_kwargs=extra_block_kwargs,
        inference_context=inference_context,
        output_processor=output_processor,
        output_processor_context=output_processor_context,
    )


def forwarding_wrapper(self, *args, **kwargs):
    """A wrapper that passes everything on (verl's ``apply_mtp_inference_patch`` shape)."""
    self.foreign_calls += 1
    return FORK_POSTPROCESS(self, *args, **kwargs)


def _install(model, replacement, where, monkeypatch):
    model.foreign_calls = 0
    if where == "instance":
        model._postprocess = types.MethodType(replacement, model)
    else:
        monkeypatch.setattr(GPTModel, "_postprocess", replacement)


@pytest.mark.parametrize("where", ["instance", "class"])
class TestForeignPostprocess:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        reset_mtp_state()

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_upstream_signature_replacement_runs_the_default_forward(self, where, monkeypatch):
        model = build_model(deterministic_config())
        tokens, position_ids, mask = causal_batch()
        mtp_runs = []
        model.mtp.register_forward_pre_hook(lambda module, args: mtp_runs.append(1))
        expected_logits = model(tokens, position_ids, mask)
        expected_loss = model(tokens, position_ids, mask, labels=tokens)
        # The fork's own _postprocess gets compute_mtp=False and skips the MTP block; the default
        # forward (what the replacement must reproduce) runs it.
        model(tokens, position_ids, mask, compute_mtp=False)
        assert len(mtp_runs) == 2, "compute_mtp=False ran the MTP block on the fork's _postprocess"

        _install(model, upstream_signature_postprocess, where, monkeypatch)
        logits = model(tokens, position_ids, mask)
        loss = model(tokens, position_ids, mask, labels=tokens, compute_mtp=True)
        assert model.foreign_calls == 2
        assert len(mtp_runs) == 4, "the replacement runs the default forward, MTP block included"
        assert torch.equal(logits, expected_logits)
        assert torch.equal(loss, expected_loss)

    def test_compute_mtp_false_is_refused_naming_the_replacement(self, where, monkeypatch):
        model = build_model(deterministic_config())
        _install(model, upstream_signature_postprocess, where, monkeypatch)
        tokens, position_ids, mask = causal_batch()
        with pytest.raises(RuntimeError) as raised:
            model(tokens, position_ids, mask, compute_mtp=False)
        message = str(raised.value)
        assert "GPTModel._postprocess was replaced by" in message
        assert f"{__name__}.upstream_signature_postprocess" in message
        assert "compute_mtp=False" in message
        assert model.foreign_calls == 0, "the replacement must not run with the argument dropped"

    def test_replacement_taking_kwargs_receives_compute_mtp(self, where, monkeypatch):
        model = build_model(deterministic_config())
        tokens, position_ids, mask = causal_batch()
        expected = model(tokens, position_ids, mask, compute_mtp=False)
        mtp_runs = []
        model.mtp.register_forward_pre_hook(lambda module, args: mtp_runs.append(module))

        _install(model, forwarding_wrapper, where, monkeypatch)
        logits = model(tokens, position_ids, mask, compute_mtp=False)
        assert model.foreign_calls == 1
        assert mtp_runs == [], "compute_mtp=False did not reach the fork's _postprocess"
        assert torch.equal(logits, expected)
        model(tokens, position_ids, mask)
        assert len(mtp_runs) == 1, "sanity: the MTP block runs by default"
