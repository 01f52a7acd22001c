"""``mtp_detach_output_layer``: the MTP loss leaves the output layer (and embeddings) untouched
but still trains the MTP layers and the decoder; the main loss still trains the output layer.

The MTP-only gradient is obtained by scaling the main output by zero: the MTP loss gets its
gradient from ``MTPLossAutoScaler``'s backward regardless. ``decoder_input`` is passed in
precomputed and detached so the decoder's own embedding lookup cannot feed the word embeddings:
any gradient they receive then comes from the MTP path (output projection or MTP lookup).
"""

import pytest
import torch

from megatron.core import tensor_parallel
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.multi_token_prediction import process_mtp_loss
from megatron.core.transformer.mtp_frozen_output_layer import (
    FrozenOutputLayer,
    freeze_output_layer_for_mtp,
)
from tests.unit_tests.test_utilities import Utils, unit_device
from tests.unit_tests.transformer.mtp_testing import (
    reset_mtp_state,
    VOCAB,
    attach_main_grads,
    build_model,
    causal_batch,
    deterministic_config,
    grad_of,
    is_zero_grad,
    main_only_backward,
    mtp_only_backward,
    tiny_moe_mtp_config,
    use_cpu_wgrad_accumulation,
    DETACH_MODES,
    real_or_standin_wgrad_accumulation,
)

MODES = DETACH_MODES


def _config(mode, **overrides):
    return deterministic_config(**MODES[mode], **overrides)


def _detached_decoder_input(model, tokens, position_ids):
    with torch.no_grad():
        return model.embedding(input_ids=tokens, position_ids=position_ids).detach()


def _head_weight(model):
    """The output projection's weight: its own, or the word embeddings' when tied."""
    if model.output_layer.weight is not None:
        return model.output_layer.weight
    return model.embedding.word_embeddings.weight


def _groups(model):
    named = dict(model.named_parameters())
    head = _head_weight(model)
    return {
        "head": [head],
        "embedding": [p for n, p in named.items() if n.startswith("embedding.")],
        "decoder": [p for n, p in named.items() if n.startswith("decoder.layers.")],
        "mtp": [p for n, p in named.items() if n.startswith("mtp.")],
    }


def _mtp_only_grads(mode, tied, labels=True, **config_overrides):
    model = build_model(_config(mode, **config_overrides), tied=tied)
    tokens, position_ids, mask = causal_batch()
    decoder_input = _detached_decoder_input(model, tokens, position_ids)
    mtp_only_backward(
        model,
        tokens,
        position_ids,
        mask,
        decoder_input=decoder_input,
        labels=tokens if labels else None,
    )
    return model, _groups(model)


class TestMTPDetachOutputLayerConfig:
    def test_rejects_mtp_detach_heads_together(self):
        with pytest.raises(ValueError, match="contradicts mtp_detach_heads=True"):
            tiny_moe_mtp_config(mtp_detach_output_layer=True, mtp_detach_heads=True)

    def test_rejects_without_mtp_layers(self):
        with pytest.raises(ValueError, match="needs MTP layers, but mtp_num_layers is None"):
            tiny_moe_mtp_config(mtp_num_layers=None, mtp_detach_output_layer=True)

    def test_rejects_the_mxfp8_output_projection(self):
        with pytest.raises(ValueError, match="not supported with fp8_output_proj=True"):
            tiny_moe_mtp_config(
                mtp_detach_output_layer=True, fp8="e4m3", fp8_recipe="mxfp8", fp8_output_proj=True
            )

    def test_accepts_alone(self):
        config = tiny_moe_mtp_config(mtp_detach_output_layer=True)
        assert config.mtp_detach_output_layer and not config.mtp_detach_heads


class TestMTPDetachOutputLayerGradients:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        reset_mtp_state()

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.slow
    @pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
    @pytest.mark.parametrize("fused_ce", [False, True], ids=["native_ce", "fused_ce"])
    def test_mtp_loss_leaves_head_and_embedding_untouched(self, tied, fused_ce):
        _, groups = _mtp_only_grads(
            "output_layer",
            tied,
            cross_entropy_loss_fusion=fused_ce,
            cross_entropy_fusion_impl="native",
        )
        assert all(is_zero_grad(p) for p in groups["head"]), "MTP loss trained the output layer"
        assert all(is_zero_grad(p) for p in groups["embedding"]), "MTP loss trained embeddings"
        assert not all(is_zero_grad(p) for p in groups["decoder"]), "MTP loss must reach the trunk"
        assert not any(is_zero_grad(p) for p in groups["mtp"] if p.dim() > 1), (
            "every MTP weight matrix must be trained by the MTP loss"
        )

    @pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
    def test_rl_path_without_labels_is_isolated_too(self, tied):
        # labels=None: MTP labels are derived from input_ids and logits are returned.
        _, groups = _mtp_only_grads("output_layer", tied, labels=False)
        assert all(is_zero_grad(p) for p in groups["head"] + groups["embedding"])
        assert not all(is_zero_grad(p) for p in groups["decoder"])
        assert not all(is_zero_grad(p) for p in groups["mtp"])

    @pytest.mark.parametrize("mode", ["none", "output_layer"])
    @pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
    def test_embedding_gets_mtp_gradient_only_as_decoder_input(self, tied, mode):
        # Without the decoder_input bypass the MTP gradient that reaches the decoder flows on
        # into the decoder's input embedding lookup, like any decoder gradient. In head-only
        # mode that must be the word embeddings' *only* MTP gradient: exactly the lookup's
        # scatter of the gradient at the decoder's embedding output.
        model = build_model(_config(mode), tied=tied)
        tokens, position_ids, mask = causal_batch()
        captured = []

        def capture_first_call(module, args, output):
            if not captured:
                captured.append(None)
                output.register_hook(lambda grad: captured.__setitem__(0, grad.clone()))

        handle = model.embedding.register_forward_hook(capture_first_call)
        mtp_only_backward(model, tokens, position_ids, mask, labels=tokens)
        handle.remove()
        grad_at_decoder_input = captured[0]  # [s, b, h]
        word_embeddings = model.embedding.word_embeddings.weight
        lookup_only = torch.zeros_like(word_embeddings).index_add_(
            0,
            tokens.t().reshape(-1),
            grad_at_decoder_input.reshape(-1, grad_at_decoder_input.shape[-1]),
        )
        assert lookup_only.abs().sum() > 0
        if mode == "output_layer":
            torch.testing.assert_close(grad_of(word_embeddings), lookup_only)
        else:
            assert not torch.allclose(grad_of(word_embeddings), lookup_only)

    @pytest.mark.slow
    @pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
    def test_relation_to_upstream_modes(self, tied):
        # Without any detach the MTP loss trains head, embeddings and trunk; mtp_detach_heads
        # cuts all three; mtp_detach_output_layer cuts head and embeddings but not the trunk.
        _, plain = _mtp_only_grads("none", tied)
        assert not is_zero_grad(plain["head"][0])
        assert not all(is_zero_grad(p) for p in plain["embedding"])
        assert not all(is_zero_grad(p) for p in plain["decoder"])

        _, heads = _mtp_only_grads("heads", tied)
        assert all(is_zero_grad(p) for p in heads["head"] + heads["embedding"] + heads["decoder"])
        assert not all(is_zero_grad(p) for p in heads["mtp"])

    @pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
    def test_main_loss_still_trains_output_layer(self, tied):
        model = build_model(_config("output_layer"), tied=tied)
        tokens, position_ids, mask = causal_batch()
        decoder_input = _detached_decoder_input(model, tokens, position_ids)
        head = _head_weight(model)
        kwargs = dict(decoder_input=decoder_input, labels=tokens)

        main_only_backward(model, tokens, position_ids, mask, **kwargs)
        main_grad = grad_of(head).clone()
        assert main_grad.abs().sum() > 0, "the main LM loss no longer trains the output layer"

        model.zero_grad(set_to_none=True)
        out = model(tokens, position_ids, mask, **kwargs)
        out.sum().backward()  # main loss + MTP loss
        torch.testing.assert_close(grad_of(head), main_grad, rtol=0, atol=0)

    def test_without_detach_mtp_loss_changes_head_gradient(self):
        # The comparison above is meaningful: with no detach the MTP loss does add to it.
        model = build_model(_config("none"))
        tokens, position_ids, mask = causal_batch()
        head = _head_weight(model)
        main_only_backward(model, tokens, position_ids, mask, labels=tokens)
        main_grad = grad_of(head).clone()
        model.zero_grad(set_to_none=True)
        model(tokens, position_ids, mask, labels=tokens).sum().backward()
        assert not torch.allclose(grad_of(head), main_grad)

    @pytest.mark.slow
    @pytest.mark.parametrize("mode", ["output_layer", "heads"])
    @pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
    def test_with_gradient_accumulation_fusion_on_cpu(self, monkeypatch, mode, tied):
        # Accumulation fusion writes weight.main_grad directly; a frozen MTP projection must
        # not. The APEX kernel is replaced by a CPU double with the same contract.
        use_cpu_wgrad_accumulation(monkeypatch)
        model = build_model(_config(mode, gradient_accumulation_fusion=True), tied=tied)
        attach_main_grads(model)
        tokens, position_ids, mask = causal_batch()
        decoder_input = _detached_decoder_input(model, tokens, position_ids)
        mtp_only_backward(
            model, tokens, position_ids, mask, decoder_input=decoder_input, labels=tokens
        )
        groups = _groups(model)
        assert all(is_zero_grad(p) for p in groups["head"] + groups["embedding"])
        assert not all(is_zero_grad(p) for p in groups["mtp"])
        assert all(is_zero_grad(p) for p in groups["decoder"]) == (mode == "heads")

        # And the main loss still accumulates into the head's main_grad.
        attach_main_grads(model)
        main_only_backward(
            model, tokens, position_ids, mask, decoder_input=decoder_input, labels=tokens
        )
        assert not is_zero_grad(_head_weight(model))


class _PlainLinearHead(torch.nn.Module):
    """An output layer computing with ``F.linear`` (no frozen-weight kernel), with a bias."""

    def __init__(self, hidden, vocab):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(vocab, hidden) * 0.1)
        self.bias = torch.nn.Parameter(torch.randn(vocab) * 0.1)
        self.gather_output = True

    def forward(self, x, weight=None, runtime_gather_output=None):
        weight = self.weight if weight is None else weight
        return torch.nn.functional.linear(x, weight, self.bias), None


class TestFrozenOutputLayerBias:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        reset_mtp_state()

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def _heads(self, config):
        torch.manual_seed(0)
        column = tensor_parallel.ColumnParallelLinear(
            config.hidden_size,
            VOCAB,
            config=config,
            init_method=torch.nn.init.normal_,
            bias=True,
            gather_output=False,
        )
        with torch.no_grad():
            column.bias.normal_()
        # Both initialised on the CPU (the same numbers everywhere), then moved to unit_device().
        plain = _PlainLinearHead(config.hidden_size, VOCAB)
        return {"column_parallel": column.to(unit_device()), "plain": plain.to(unit_device())}

    @pytest.mark.parametrize("head_kind", ["column_parallel", "plain"])
    @pytest.mark.parametrize("mode", ["none", "output_layer", "heads"])
    def test_biased_head_is_frozen_for_mtp_loss(self, head_kind, mode):
        config = _config(mode)
        head = self._heads(config)[head_kind]
        seq, batch, depth = 8, 2, config.mtp_num_layers
        device = unit_device()
        hidden = torch.randn((1 + depth) * seq, batch, config.hidden_size)
        hidden = hidden.to(device).requires_grad_()
        input_ids = torch.randint(0, VOCAB, (batch, seq)).to(device)

        def ce(labels, logits):
            return tensor_parallel.vocab_parallel_cross_entropy(
                logits, labels.transpose(0, 1).contiguous()
            ).transpose(0, 1)

        out = process_mtp_loss(
            hidden_states=hidden,
            labels=None,
            loss_mask=None,
            output_layer=head,
            output_weight=None,
            runtime_gather_output=None,
            is_training=False,
            compute_language_model_loss=ce,
            config=config,
            input_ids=input_ids,
        )
        (out * 0).sum().backward()
        frozen = mode != "none"
        assert (head.weight.grad is None) == frozen
        # For the plain head F.linear would train the bias: only the explicit detach stops it.
        assert (head.bias.grad is None) == frozen
        mtp_rows = hidden.grad[seq:]
        assert mtp_rows.abs().sum() > 0, "the MTP hidden states must still get a gradient"

        # The layer itself is unchanged: a normal call afterwards trains weight and bias.
        assert isinstance(head.bias, torch.nn.Parameter)
        head.zero_grad(set_to_none=True)
        logits, _ = head(torch.randn(seq, batch, config.hidden_size).to(device))
        logits.sum().backward()
        assert head.weight.grad is not None and head.bias.grad is not None
        assert head.bias.grad.abs().sum() > 0

    def test_wrapper_forwards_attributes_and_is_idempotent(self):
        head = _PlainLinearHead(8, VOCAB).to(unit_device())
        frozen, weight = freeze_output_layer_for_mtp(head, None)
        assert isinstance(frozen, FrozenOutputLayer) and weight is None
        assert frozen.gather_output is True
        again, _ = freeze_output_layer_for_mtp(frozen, None)
        assert again is frozen

    def test_missing_weight_is_a_clear_error(self):
        head = _PlainLinearHead(8, VOCAB).to(unit_device())
        head.weight = None
        with pytest.raises(RuntimeError, match="no output_weight was passed"):
            FrozenOutputLayer(head)(torch.randn(2, 1, 8).to(unit_device()))


@pytest.mark.gpu
class TestMTPDetachOutputLayerGradientAccumulationFusionGPU:
    """Same isolation on CUDA with APEX's real gradient-accumulation-fusion kernel."""

    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        reset_mtp_state()

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.parametrize("ce", ["native", "fused_native", "fused_te"])
    @pytest.mark.parametrize("mode", ["output_layer", "heads"])
    @pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
    def test_isolation_with_gradient_accumulation_fusion(self, monkeypatch, mode, tied, ce):
        from megatron.core.extensions.transformer_engine import HAVE_TE

        real_or_standin_wgrad_accumulation(monkeypatch)
        if ce == "fused_te" and not HAVE_TE:
            pytest.skip("Transformer Engine is not installed")
        ce_config = dict(
            cross_entropy_loss_fusion=ce != "native",
            cross_entropy_fusion_impl="te" if ce == "fused_te" else "native",
        )
        config = _config(mode, gradient_accumulation_fusion=True, **ce_config)
        model = build_model(config, tied=tied).cuda()
        attach_main_grads(model)
        tokens, position_ids, mask = (t.cuda() for t in causal_batch())
        decoder_input = _detached_decoder_input(model, tokens, position_ids)
        kwargs = dict(decoder_input=decoder_input, labels=tokens)
        mtp_only_backward(model, tokens, position_ids, mask, **kwargs)
        groups = _groups(model)
        head = groups["head"][0]
        assert head.main_grad.abs().sum() == 0, "MTP loss wrote the output layer's main_grad"
        assert all(is_zero_grad(p) for p in groups["embedding"])
        assert not all(is_zero_grad(p) for p in groups["mtp"])
        assert all(is_zero_grad(p) for p in groups["decoder"]) == (mode == "heads")

        attach_main_grads(model)
        main_only_backward(model, tokens, position_ids, mask, **kwargs)
        main_grad = head.main_grad.clone()
        assert main_grad.abs().sum() > 0, "the main loss must still train the output layer"
        attach_main_grads(model)
        model(tokens, position_ids, mask, **kwargs).sum().backward()
        torch.testing.assert_close(head.main_grad, main_grad)
