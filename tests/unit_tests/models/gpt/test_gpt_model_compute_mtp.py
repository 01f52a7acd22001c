"""MTP-free forwards: ``GPTModel.forward(..., compute_mtp=False)`` and MTP-free reference models.

RL reference and old-log-prob forwards only need logits. ``compute_mtp=False`` must skip the MTP
block and the MTP loss together and return exactly what the same weights give in a model built
without MTP layers (``mtp_free_config`` + ``load_state_dict_without_mtp``).
"""

import pytest
import torch

from megatron.core.models.gpt import mtp_free
from megatron.core.models.gpt.mtp_free import (
    load_state_dict_without_mtp,
    mtp_free_config,
    split_mtp_state_dict,
)
from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler
from tests.unit_tests.test_utilities import Utils
from tests.unit_tests.transformer.mtp_testing import (
    reset_mtp_state,
    SEQ,
    VOCAB,
    build_model,
    causal_batch,
    deterministic_config,
)


class _CallCounter:
    """Forward pre-hooks on every module of a subtree, counting calls."""

    def __init__(self, root):
        self.calls = 0
        self.handles = [m.register_forward_pre_hook(self._hook) for m in root.modules()]

    def _hook(self, module, args):
        self.calls += 1

    def remove(self):
        for handle in self.handles:
            handle.remove()


def _pair(tied=False, **overrides):
    config = deterministic_config(**overrides)
    model = build_model(config, tied=tied)
    reference = build_model(mtp_free_config(config), tied=tied, with_mtp=False, seed=99)
    dropped = load_state_dict_without_mtp(reference, model.state_dict())
    assert dropped and all(key.startswith("mtp.") for key in dropped)
    return model, reference


class TestGPTModelComputeMTP:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        reset_mtp_state()

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.parametrize("mtp_num_layers", [1, 2])
    @pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
    def test_logits_equal_model_without_mtp_and_mtp_never_runs(self, tied, mtp_num_layers):
        model, reference = _pair(tied, mtp_num_layers=mtp_num_layers)
        assert not hasattr(reference, "mtp") and reference.config.mtp_num_layers is None
        tokens, position_ids, mask = causal_batch()
        mtp_calls = _CallCounter(model.mtp)
        embedding_calls = _CallCounter(model.embedding.word_embeddings)

        logits = model(tokens, position_ids, mask, compute_mtp=False)
        assert mtp_calls.calls == 0, "an MTP module ran although compute_mtp=False"
        assert embedding_calls.calls == 1, "only the decoder's embedding lookup may run"
        expected = reference(tokens, position_ids, mask)
        assert logits.shape == (tokens.shape[0], SEQ, VOCAB)
        assert torch.equal(logits, expected)

        # The hooks do see the MTP block when it runs (default behaviour is unchanged).
        model(tokens, position_ids, mask)
        assert mtp_calls.calls > 0
        mtp_calls.remove()
        embedding_calls.remove()

    @pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
    def test_loss_and_gradients_equal_model_without_mtp(self, monkeypatch, tied):
        model, reference = _pair(tied)
        attached = []
        original_apply = MTPLossAutoScaler.apply

        def counting_apply(*args):
            attached.append(args)
            return original_apply(*args)

        monkeypatch.setattr(MTPLossAutoScaler, "apply", counting_apply)
        tokens, position_ids, mask = causal_batch()

        loss = model(tokens, position_ids, mask, labels=tokens, compute_mtp=False)
        assert attached == [], "an MTP loss was attached although compute_mtp=False"
        expected = reference(tokens, position_ids, mask, labels=tokens)
        assert torch.equal(loss, expected)
        loss.sum().backward()
        expected.sum().backward()

        reference_grads = dict(reference.named_parameters())
        for name, param in model.named_parameters():
            if name.startswith("mtp."):
                assert param.grad is None, f"{name} got a gradient with compute_mtp=False"
            else:
                assert torch.equal(param.grad, reference_grads[name].grad), name

        model(tokens, position_ids, mask, labels=tokens)
        assert attached, "sanity: the default forward does attach the MTP loss"

    def test_no_grad_eval_forward_skips_mtp(self):
        # The old-log-prob / reference pattern: eval mode, no grad, labels=None.
        model, reference = _pair()
        model.eval()
        reference.eval()
        tokens, position_ids, mask = causal_batch(3)
        mtp_calls = _CallCounter(model.mtp)
        with torch.no_grad():
            model(tokens, position_ids, mask)
            assert mtp_calls.calls > 0, "upstream runs the MTP block even here"
            mtp_calls.calls = 0
            logits = model(tokens, position_ids, mask, compute_mtp=False)
            expected = reference(tokens, position_ids, mask)
        assert mtp_calls.calls == 0
        assert torch.equal(logits, expected)
        mtp_calls.remove()

    def test_compute_mtp_true_is_the_default_behaviour(self):
        model, _ = _pair()
        tokens, position_ids, mask = causal_batch()
        mtp_calls = _CallCounter(model.mtp)
        explicit = model(tokens, position_ids, mask, labels=tokens, compute_mtp=True)
        calls = mtp_calls.calls
        default = model(tokens, position_ids, mask, labels=tokens)
        assert calls > 0 and mtp_calls.calls == 2 * calls
        assert torch.equal(explicit, default)
        mtp_calls.remove()

    def test_compute_mtp_true_without_mtp_layers_is_an_error(self):
        _, reference = _pair()
        tokens, position_ids, mask = causal_batch()
        with pytest.raises(ValueError, match=r"compute_mtp=True, but the model has no MTP"):
            reference(tokens, position_ids, mask, compute_mtp=True)
        # False on a model without MTP is a no-op.
        assert torch.equal(
            reference(tokens, position_ids, mask, compute_mtp=False),
            reference(tokens, position_ids, mask),
        )


class TestMTPFreeReferenceModel:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        reset_mtp_state()

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_config_copy_drops_only_mtp_fields(self):
        config = deterministic_config(mtp_num_layers=2, mtp_detach_output_layer=True)
        ref_config = mtp_free_config(config)
        assert ref_config is not config
        assert ref_config.mtp_num_layers is None and not ref_config.mtp_detach_output_layer
        assert config.mtp_num_layers == 2 and config.mtp_detach_output_layer, "input mutated"
        for field in ("hidden_size", "num_layers", "num_moe_experts", "ffn_hidden_size"):
            assert getattr(ref_config, field) == getattr(config, field)

    def test_reference_allocates_no_mtp_parameters(self):
        config = deterministic_config(mtp_num_layers=2)
        reference = build_model(mtp_free_config(config), with_mtp=False)
        full = build_model(config)
        assert not any(name.startswith("mtp.") for name, _ in reference.named_parameters())
        n_ref = sum(p.numel() for p in reference.parameters())
        n_mtp = sum(p.numel() for n, p in full.named_parameters() if n.startswith("mtp."))
        assert n_ref + n_mtp == sum(p.numel() for p in full.parameters())

    def test_naive_reference_with_mtp_config_fails(self):
        # Why mtp_free_config exists: with mtp_num_layers still set, the MTP loss runs on half
        # of the decoder output (split into 1 + mtp_num_layers chunks) against full-length
        # labels derived from input_ids.
        config = deterministic_config(mtp_num_layers=1)
        naive = build_model(config, with_mtp=False)
        tokens, position_ids, mask = causal_batch()
        with pytest.raises(IndexError, match="shape mismatch"):
            naive(tokens, position_ids, mask)
        fixed = build_model(mtp_free_config(config), with_mtp=False)
        assert fixed(tokens, position_ids, mask).shape == (tokens.shape[0], SEQ, VOCAB)

    def test_loading_still_checks_non_mtp_keys(self):
        config = deterministic_config()
        model = build_model(config)
        reference = build_model(mtp_free_config(config), with_mtp=False)
        state = dict(model.state_dict())
        state.pop("decoder.final_layernorm.weight")
        with pytest.raises(RuntimeError, match="decoder.final_layernorm.weight"):
            load_state_dict_without_mtp(reference, state)
        with pytest.raises(ValueError, match="has an MTP block"):
            load_state_dict_without_mtp(model, model.state_dict())

    def test_split_with_wrapper_prefix(self):
        state = {"module.mtp.layers.0.w": 1, "module.decoder.w": 2, "module.mtpx": 3}
        kept, dropped = split_mtp_state_dict(state, prefix="module.")
        assert dropped == ["module.mtp.layers.0.w"]
        assert kept == {"module.decoder.w": 2, "module.mtpx": 3}

    def test_layout_with_mtp_is_rejected(self, monkeypatch):
        from megatron.core.transformer.pipeline_parallel_layer_layout import (
            PipelineParallelLayerLayout,
        )

        config = deterministic_config()
        layout = PipelineParallelLayerLayout("Et|tmL", pipeline_model_parallel_size=2)
        monkeypatch.setattr(config, "pipeline_model_parallel_layout", layout)
        with pytest.raises(ValueError, match="places MTP layers"):
            mtp_free.mtp_free_config(config)

    def test_distributed_checkpoint_of_mtp_model_loads_into_reference(self, tmp_path):
        from megatron.core import dist_checkpointing

        config = deterministic_config()
        model = build_model(config)
        reference = build_model(mtp_free_config(config), with_mtp=False, seed=7)
        (tmp_path / "ckpt").mkdir()
        dist_checkpointing.save(model.sharded_state_dict(), str(tmp_path / "ckpt"))
        # The checkpoint really holds the MTP block: a fresh MTP model gets it back.
        other = build_model(config, seed=8)
        other.load_state_dict(
            dist_checkpointing.load(other.sharded_state_dict(), str(tmp_path / "ckpt"))
        )
        for (name, p), q in zip(model.named_parameters(), other.parameters()):
            if name.startswith("mtp."):
                assert torch.equal(p, q), name

        loaded = dist_checkpointing.load(reference.sharded_state_dict(), str(tmp_path / "ckpt"))
        reference.load_state_dict(loaded)
        tokens, position_ids, mask = causal_batch()
        assert torch.equal(
            reference(tokens, position_ids, mask),
            model(tokens, position_ids, mask, compute_mtp=False),
        )
