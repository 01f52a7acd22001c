"""Local ``DotProductAttention`` with multi-latent attention's head sizes (no Transformer Engine).

MLA builds its core attention with ``k_channels`` (query/key head size) and ``v_channels`` (value
head size), as TE's attention takes them; the local attention must too, so MLA models (DeepSeek-V3
through mbridge, say) build and run on CPU-only machines.
"""

import math

import torch

from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
from tests.unit_tests.test_utilities import Utils, unit_device


class TestLocalAttentionHeadSizes:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_key_and_value_head_sizes_differ(self):
        config = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4,
                                   use_cpu_initialization=True, attention_dropout=0.0)
        device = unit_device()
        attention = DotProductAttention(config, 1, AttnMaskType.causal, "self",
                                        softmax_scale=0.25, k_channels=12, v_channels=6).to(device)
        sq, b, heads = 5, 2, 4
        query, key = torch.randn(sq, b, heads, 12).to(device), torch.randn(sq, b, heads, 12).to(device)
        value = torch.randn(sq, b, heads, 6).to(device)
        mask = torch.triu(torch.ones(sq, sq), diagonal=1).bool()[None, None].to(device)
        context = attention(query, key, value, mask)
        assert context.shape == (sq, b, heads * 6)
        scores = torch.einsum("qbhd,kbhd->bhqk", query, key) * 0.25
        probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
        expected = torch.einsum("bhqk,kbhd->qbhd", probs, value).reshape(sq, b, heads * 6)
        torch.testing.assert_close(context, expected)

    def test_default_head_size_is_kv_channels(self):
        config = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4,
                                   use_cpu_initialization=True)
        attention = DotProductAttention(config, 1, AttnMaskType.causal, "self")
        assert attention.hidden_size_per_partition == 32
        assert attention.softmax_scale == 1.0 / math.sqrt(8)

    def test_mla_gpt_model_builds_and_trains_with_local_specs(self):
        config = MLATransformerConfig(
            num_layers=2, hidden_size=32, num_attention_heads=4, use_cpu_initialization=True,
            q_lora_rank=16, kv_lora_rank=8, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=6,
            rope_type="rope", add_bias_linear=False, qk_layernorm=True,
        )
        spec = get_gpt_layer_local_spec(multi_latent_attention=True, qk_layernorm=True)
        device = unit_device()
        model = GPTModel(config, spec, vocab_size=64, max_sequence_length=8,
                         position_embedding_type="rope").to(device)
        tokens = torch.randint(0, 64, (2, 8)).to(device)
        positions = torch.arange(8).expand(2, 8).to(device)
        mask = torch.triu(torch.ones(8, 8), diagonal=1).bool()[None, None].to(device)
        loss = model(tokens, positions, mask, labels=tokens)
        loss.sum().backward()
        assert torch.isfinite(loss).all()
        proj = model.decoder.layers[0].self_attention.linear_proj.weight
        assert proj.shape == (32, 4 * 6) and proj.grad is not None
