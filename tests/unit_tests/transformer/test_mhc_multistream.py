"""The mHC multistream contract between the decoder and the MTP block.

The decoder widens the residual stream to n streams ``[s, b, n*h]``; with MTP it returns
``(contracted_hidden, mhc_multistream)`` and GPTModel must hand the multistream to the MTP block.
The verl crash this guards against: a postprocess that dropped ``mhc_multistream`` so MTP took the
``[s, b, h]`` path and died in a reshape. Here that is a clear error naming the caller.
"""

import pytest
import torch

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_block import TransformerBlock
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import (
    BATCH,
    SEQ,
    build_gpt,
    causal_batch,
)
from tests.unit_tests.test_utilities import Utils, run_distributed, unit_device
from tests.unit_tests.transformer.mtp_testing import train_on_batch
from tests.unit_tests.transformer.test_hyper_connection import N, mhc_config, mhc_mtp_config


def _mtp_under_sequence_parallel(rank, world_size):
    """TP=2 with sequence parallelism: each rank's MTP layer projects its own sequence shard of
    the n streams (eh_proj gathers the TP-split output, then it is scattered back over the
    sequence), so its inner layer sees [s/tp, b, n*h] like the decoder layers."""
    from tests.unit_tests.transformer.moe.test_router_replay_ep_sp import (
        _allow_torch_norm_under_sequence_parallel,
    )

    _allow_torch_norm_under_sequence_parallel()  # forward only, see there
    Utils.initialize_model_parallel(tensor_model_parallel_size=2)
    torch.manual_seed(0)
    cfg = mhc_mtp_config(tensor_model_parallel_size=2, sequence_parallel=True)
    model = build_gpt(cfg).to(unit_device())
    model.eval()
    layer = model.mtp.layers[0]
    original, seen = layer._concat_embeddings, {}

    def recording(hidden_states, decoder_input):
        out = original(hidden_states, decoder_input)
        seen.update(multistream=tuple(hidden_states.shape), projected=tuple(out.shape))
        return out

    layer._concat_embeddings = recording
    tokens, position_ids, mask = causal_batch()
    with torch.no_grad():
        loss = model(tokens, position_ids, mask, labels=tokens)
    shard = (SEQ // 2, BATCH, N * cfg.hidden_size)
    assert seen == {"multistream": shard, "projected": shard}, seen
    assert loss.shape == (BATCH, SEQ) and torch.isfinite(loss).all()


class TestMTPMultistreamSequenceParallel:
    @pytest.mark.slow
    def test_two_gloo_ranks_tp2(self):
        run_distributed(_mtp_under_sequence_parallel, 2)


class TestMTPMultistream:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_trains_with_falling_loss(self):
        torch.manual_seed(0)
        model = build_gpt(mhc_mtp_config())
        losses = train_on_batch(model, causal_batch(), steps=6)
        assert all(torch.isfinite(torch.tensor(losses)))
        assert losses[-1] < losses[0] - 0.1, losses
        hc = [n for n, p in model.named_parameters() if "hyper_connection" in n or "hc_head" in n]
        assert any(n.startswith("mtp.") for n in hc) and any(n.startswith("decoder.") for n in hc)

    def test_block_returns_the_multistream_only_with_mtp(self):
        cfg = mhc_mtp_config()
        spec = get_gpt_layer_local_spec(num_experts=cfg.num_moe_experts, moe_grouped_gemm=False)
        block = TransformerBlock(cfg, spec)
        x = torch.randn(SEQ, BATCH, cfg.hidden_size)
        _, _, mask = causal_batch()
        hidden, multistream = block(hidden_states=x, attention_mask=mask)
        assert hidden.shape == (SEQ, BATCH, cfg.hidden_size)
        assert multistream.shape == (SEQ, BATCH, N * cfg.hidden_size)
        plain = TransformerBlock(mhc_config(), spec)(hidden_states=x, attention_mask=mask)
        assert isinstance(plain, torch.Tensor) and plain.shape == (SEQ, BATCH, cfg.hidden_size)

    def test_sharded_state_dict_carries_the_mtp_head(self):
        model = build_gpt(mhc_mtp_config())
        mhc = {n for n, _ in model.named_parameters() if "hyper_connection" in n or "hc_head" in n}
        assert "decoder.hc_head.hc_head_fn" in mhc and "mtp.layers.0.hc_head.hc_head_fn" in mhc
        sharded = model.sharded_state_dict()
        assert mhc <= set(sharded), sorted(mhc - set(sharded))

    def test_mtp_block_receives_the_multistream(self):
        model = build_gpt(mhc_mtp_config())
        seen = {}

        def block_hook(mod, args, kwargs):
            seen["block"] = kwargs["mhc_multistream"].shape
            seen["block_hidden"] = kwargs["hidden_states"].shape

        def layer_hook(mod, args, kwargs):
            seen["layer"] = kwargs["hidden_states"].shape

        model.mtp.register_forward_pre_hook(block_hook, with_kwargs=True)
        model.mtp.layers[0].register_forward_pre_hook(layer_hook, with_kwargs=True)
        tokens, position_ids, mask = causal_batch()
        loss = model(tokens, position_ids, mask, labels=tokens)
        h = model.config.hidden_size
        assert seen["block"] == (SEQ, BATCH, N * h)
        assert seen["block_hidden"] == (SEQ, BATCH, h)  # contracted output, for the main loss
        assert seen["layer"] == (SEQ, BATCH, N * h)
        loss.mean().backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None]
        assert not missing, missing
        # Without mHC there is no multistream: the MTP layer takes the decoder's [s, b, h] output.
        seen.clear()
        plain = build_gpt(mhc_mtp_config(enable_mhc_connections=False))
        plain.mtp.layers[0].register_forward_pre_hook(layer_hook, with_kwargs=True)
        plain(tokens, position_ids, mask, labels=tokens).mean().backward()
        assert seen == {"layer": (SEQ, BATCH, h)}, seen

    def test_mtp_layer_checks_the_multistream_it_gets(self):
        model = build_gpt(mhc_mtp_config())
        h = model.config.hidden_size
        contracted = torch.randn(SEQ, BATCH, h)  # [s, b, h]: the contracted hidden, not n streams
        with pytest.raises(
            ValueError,
            match=rf"MultiTokenPredictionLayer\._concat_embeddings: mhc_multistream must be "
            rf"\[s, b, {N * h}\].*got \({SEQ}, {BATCH}, {h}\)",
        ):
            model.mtp.layers[0]._concat_embeddings(contracted, torch.randn(SEQ, BATCH, h))

    def test_stage_that_contracts_must_hold_the_last_layer(self):
        # With MTP the contracting stage returns the multistream; a block that holds the last
        # decoder layer without post_process (or the reverse) would hand MTP the wrong one.
        cfg = mhc_mtp_config()
        spec = get_gpt_layer_local_spec(num_experts=cfg.num_moe_experts, moe_grouped_gemm=False)
        with pytest.raises(ValueError, match=r"the last decoder layer and the MTP layers on the "
                           r"same \(last\) pipeline stage"):
            TransformerBlock(cfg, spec, post_process=False)
        TransformerBlock(mhc_config(), spec, post_process=False)  # no MTP: nothing to hand over

    def test_dropped_multistream_is_a_clear_error(self):
        model = build_gpt(mhc_mtp_config())
        original = model._postprocess

        def postprocess_that_drops_it(**kwargs):  # what the buggy verl override did
            kwargs["mhc_multistream"] = None
            return original(**kwargs)

        model._postprocess = postprocess_that_drops_it
        tokens, position_ids, mask = causal_batch()
        with pytest.raises(ValueError, match=r"MultiTokenPredictionBlock\.forward.*got None"):
            model(tokens, position_ids, mask, labels=tokens)

    def test_detached_mtp_heads_take_the_multistream_without_grad_to_the_decoder(self):
        torch.manual_seed(0)
        model = build_gpt(mhc_mtp_config(mtp_detach_heads=True))
        seen = {}

        def layer_hook(mod, args, kwargs):
            seen["input"] = kwargs["hidden_states"]

        model.mtp.layers[0].register_forward_pre_hook(layer_hook, with_kwargs=True)
        tokens, position_ids, mask = causal_batch()
        loss = model(tokens, position_ids, mask, labels=tokens)
        assert seen["input"].shape == (SEQ, BATCH, N * model.config.hidden_size)
        assert seen["input"].grad_fn is None, "the MTP depth input must be cut from the decoder"
        loss.mean().backward()
        for prefix in ("decoder.", "mtp."):
            grads = [p.grad for n, p in model.named_parameters() if n.startswith(prefix)]
            assert grads and all(g is not None and g.abs().sum() > 0 for g in grads), prefix


class TestMTPSpeculativeDecodingUnderMHC:
    """MTP drafting needs the decoder's multistream at the accepted positions, which the
    inference engine does not keep: refused with the options to change, not a TypeError."""

    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def _draft_inputs(self, cfg, n=3):
        hidden = torch.randn(n, 1, cfg.hidden_size)
        next_tokens = torch.randint(0, 64, (1, n))
        positions = torch.arange(n).unsqueeze(0)
        return hidden, next_tokens, positions

    def test_drafting_step_is_refused_naming_the_options(self):
        model = build_gpt(mhc_mtp_config()).eval()
        with torch.no_grad(), pytest.raises(
            ValueError,
            match=r"MultiTokenPredictionLayer\.forward_single_position: enable_mhc_connections "
            r"does not support MTP speculative decoding.*num_speculative_tokens=0",
        ):
            model.compute_mtp_single_step(*self._draft_inputs(model.config))

    def test_engine_check_refuses_speculative_tokens_only(self):
        from megatron.core.transformer.mhc_multistream import refuse_mtp_speculative_decoding

        cfg = mhc_mtp_config()
        refuse_mtp_speculative_decoding(cfg, 0, "DynamicInferenceEngine")  # plain decoding is fine
        with pytest.raises(ValueError, match=r"DynamicInferenceEngine: .*num_speculative_tokens=2"):
            refuse_mtp_speculative_decoding(cfg, 2, "DynamicInferenceEngine")
