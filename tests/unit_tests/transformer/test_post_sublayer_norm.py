"""Post-attention / post-MLP layernorm (patch post-sublayer-layernorm)."""

import dataclasses

import pytest
import torch

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.post_sublayer_norm import apply_post_sublayer_norm
from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import (
    build_gpt,
    causal_batch,
    tiny_moe_mtp_config,
)
from tests.unit_tests.test_utilities import Utils, unit_device

SEQ, BATCH, HIDDEN = 16, 2, 32
POST_NORMS = ("post_self_attn_layernorm", "post_mlp_layernorm")


def layer_config(moe=False, **overrides):
    values = dict(
        num_layers=2,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        use_cpu_initialization=True,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=False,
        params_dtype=torch.float32,
    )
    if moe:
        values.update(num_moe_experts=4, moe_router_topk=2, moe_token_dispatcher_type="allgather")
    values.update(overrides)
    return TransformerConfig(**values)


def local_layer_spec(config, normalization=None):
    return get_gpt_layer_local_spec(
        num_experts=config.num_moe_experts, moe_grouped_gemm=False, normalization=normalization
    )


def upstream_layer_spec(spec):
    """A spec without post-norm classes (as stock 0.19 builds it), to check the flag is refused.

    Flag-off parity with upstream is tested against pristine upstream code, in
    test_post_sublayer_norm_upstream_parity.py."""
    submodules = dataclasses.replace(
        spec.submodules, post_self_attn_layernorm=IdentityOp, post_mlp_layernorm=IdentityOp
    )
    return ModuleSpec(module=spec.module, submodules=submodules, params=spec.params)


class ApexStyleLayerNorm(torch.nn.LayerNorm):
    """Stands in for apex's FusedLayerNorm, the local backend's LayerNorm when apex is present.

    Without apex both LayerNorm and RMSNorm specs resolve to WrappedTorchNorm, which hides a
    spec that asks the backend for the wrong norm kind."""

    def __init__(self, config, hidden_size, eps=1e-5, **kwargs):
        super().__init__(hidden_size, eps=eps)


def layer_inputs(seed=0):
    """Hidden states and a causal mask on :func:`unit_device`, drawn on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(SEQ, BATCH, HIDDEN, generator=gen)
    mask = torch.triu(torch.ones(SEQ, SEQ), diagonal=1).bool()[None, None]
    return hidden.to(unit_device()), mask.to(unit_device())


def randomize_(module, seed):
    """Draws on a CPU generator (the same numbers everywhere), copied to the parameters' device."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            values = torch.randn(p.shape, generator=gen) * 0.5 + (1.0 if p.dim() == 1 else 0.0)
            p.copy_(values.to(p.device))


class TestPostSublayerNorm:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        torch.manual_seed(1234)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_flags_on_add_exactly_two_norms_per_layer_and_mtp_layer(self):
        off = build_gpt(tiny_moe_mtp_config())
        on = build_gpt(
            tiny_moe_mtp_config(post_self_attn_layernorm=True, post_mlp_layernorm=True)
        )
        extra = set(on.state_dict()) - set(off.state_dict())
        assert set(off.state_dict()) <= set(on.state_dict())
        prefixes = {k.rsplit(".", 2)[0] + "." + k.rsplit(".", 2)[1] for k in extra}
        expected = {
            f"decoder.layers.{i}.{name}" for i in range(2) for name in POST_NORMS
        } | {f"mtp.layers.0.mtp_model_layer.{name}" for name in POST_NORMS}
        assert prefixes == expected
        # LayerNorm: weight and bias per norm.
        assert len(extra) == 2 * len(expected)

    @pytest.mark.parametrize("moe", [False, True])
    @pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
    def test_zero_weight_post_norms_make_layer_identity(self, moe, normalization, monkeypatch):
        from megatron.core.models import backends

        monkeypatch.setattr(backends, "LNImpl", ApexStyleLayerNorm)
        config = layer_config(
            moe=moe,
            normalization=normalization,
            post_self_attn_layernorm=True,
            post_mlp_layernorm=True,
        )
        layer = build_module(local_layer_spec(config, normalization), config=config)
        layer = layer.to(unit_device())
        # The post norms are the kind the layer's own norms are: the backend's (fused) LayerNorm
        # for LayerNorm, torch's RMSNorm for RMSNorm.
        expected = ApexStyleLayerNorm if normalization == "LayerNorm" else torch.nn.RMSNorm
        assert type(layer.pre_mlp_layernorm) is expected
        for name in POST_NORMS:
            assert type(getattr(layer, name)) is expected, name
        # The MLA variant of the local spec picks its post norms the same way.
        mla = get_gpt_layer_local_spec(multi_latent_attention=True, normalization=normalization)
        spec_norm = ApexStyleLayerNorm if normalization == "LayerNorm" else backends.WrappedTorchNorm
        assert mla.submodules.pre_mlp_layernorm is spec_norm
        for name in POST_NORMS:
            assert getattr(mla.submodules, name) is spec_norm, name
        randomize_(layer, seed=1)
        with torch.no_grad():
            for name in POST_NORMS:
                for p in getattr(layer, name).parameters():
                    p.zero_()
        hidden, mask = layer_inputs()
        out, _ = layer(hidden, attention_mask=mask)
        assert torch.equal(out, hidden)
        # Sanity: with the post-norm weights restored the sublayers do contribute.
        with torch.no_grad():
            for name in POST_NORMS:
                getattr(layer, name).weight.fill_(1.0)
        out, _ = layer(hidden, attention_mask=mask)
        assert not torch.allclose(out, hidden)

    def test_bias_folded_before_norm_matches_reference(self):
        config = layer_config(
            add_bias_linear=True, post_self_attn_layernorm=True, post_mlp_layernorm=True
        )
        layer = build_module(local_layer_spec(config), config=config).to(unit_device())
        randomize_(layer, seed=2)
        layer.eval()
        hidden, mask = layer_inputs(seed=3)
        out, _ = layer(hidden, attention_mask=mask)

        with torch.no_grad():
            attn_out, attn_bias = layer.self_attention(
                layer.input_layernorm(hidden), attention_mask=mask
            )
            assert attn_bias is not None, "attention must return a separate bias for this test"
            h1 = hidden + layer.post_self_attn_layernorm(attn_out + attn_bias)
            mlp_out, mlp_bias = layer.mlp(layer.pre_mlp_layernorm(h1))
            assert mlp_bias is not None, "the MLP must return a separate bias for this test"
            reference = h1 + layer.post_mlp_layernorm(mlp_out + mlp_bias)
            # What adding the bias after the norm (in bias-dropout-add) would give instead.
            h1_wrong = hidden + layer.post_self_attn_layernorm(attn_out) + attn_bias
        torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(h1, h1_wrong, atol=1e-3)

        # With the flags off the pair reaches bias-dropout-add untouched: the bias stays separate
        # (a custom bda in the spec still gets it), as in an unpatched layer.
        off_config = layer_config(add_bias_linear=True)
        off_layer = build_module(local_layer_spec(off_config), config=off_config).to(unit_device())
        for name in POST_NORMS:
            passed = apply_post_sublayer_norm(getattr(off_layer, name), (attn_out, attn_bias))
            assert passed[0] is attn_out and passed[1] is attn_bias, name

    def test_gradients_reach_post_norm_weights(self):
        model = build_gpt(
            tiny_moe_mtp_config(post_self_attn_layernorm=True, post_mlp_layernorm=True)
        )
        tokens, position_ids, mask = causal_batch()
        model(tokens, position_ids, mask, labels=tokens).mean().backward()
        norm_params = {n: p for n, p in model.named_parameters() if ".post_" in n}
        assert len(norm_params) == 12  # (2 decoder + 1 MTP layer) x 2 norms x (weight, bias)
        for name, p in norm_params.items():
            assert p.grad is not None, name
            assert p.grad.abs().sum() > 0, name

    def test_flag_without_spec_norm_is_rejected(self):
        config = layer_config(post_mlp_layernorm=True)
        with pytest.raises(ValueError, match="post_mlp_layernorm"):
            build_module(upstream_layer_spec(local_layer_spec(config)), config=config)

    def test_norm_returning_a_tuple_is_rejected(self):
        class ResidualStyleNorm(torch.nn.Module):  # like a norm built with has_residual=True
            def forward(self, x):
                return x, x

        out = torch.randn(3, 2, 8).to(unit_device())
        with pytest.raises(TypeError, match="ResidualStyleNorm returned a tuple"):
            apply_post_sublayer_norm(ResidualStyleNorm().to(unit_device()), (out, None))

    def test_fused_tp_inference_is_rejected(self):
        with pytest.raises(ValueError, match="inference_fuse_tp_communication"):
            layer_config(
                transformer_impl="inference_optimized",
                normalization="RMSNorm",
                inference_fuse_tp_communication=True,
                post_self_attn_layernorm=True,
            )


@pytest.mark.gpu
class TestPostSublayerNormTE:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        torch.manual_seed(1234)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.parametrize("moe", [False, True])
    def test_te_spec_zero_weight_identity_and_grads(self, moe):
        pytest.importorskip("transformer_engine")
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_layer_with_transformer_engine_spec,
        )
        from megatron.core.extensions.transformer_engine import TENorm

        config = layer_config(
            moe=moe,
            normalization="RMSNorm",
            post_self_attn_layernorm=True,
            post_mlp_layernorm=True,
            use_cpu_initialization=False,
            moe_grouped_gemm=moe,
        )
        spec = get_gpt_layer_with_transformer_engine_spec(
            num_experts=config.num_moe_experts, moe_grouped_gemm=moe
        )
        layer = build_module(spec, config=config).cuda()
        for name in POST_NORMS:
            assert not isinstance(getattr(layer, name), IdentityOp)
        hidden, _ = layer_inputs()
        hidden = hidden.cuda().requires_grad_()
        out, _ = layer(hidden, attention_mask=None)
        out.sum().backward()
        for name in POST_NORMS:
            grad = getattr(layer, name).weight.grad
            assert grad is not None and grad.abs().sum() > 0, name
        with torch.no_grad():
            for name in POST_NORMS:
                getattr(layer, name).weight.zero_()
            out, _ = layer(hidden.detach(), attention_mask=None)
        assert torch.equal(out, hidden.detach())
