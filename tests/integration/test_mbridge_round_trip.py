"""HF -> fork -> HF through mbridge 0.15.1, for a dense, an MoE and an MLA + MoE model.

Tiny models are built locally with ``transformers`` (random init, float32), saved, loaded into the
fork through mbridge's own bridges (CPU: local specs, see ``mbridge_cpu``), and compared with
``transformers`` on the same tokens; the exported weights must equal the HF ones bit for bit.

Tolerance: both sides run the same float32 maths in a different order (fused QKV and gate/up
GEMMs, another softmax and RMSNorm implementation, expert order in the MoE sum), so logits differ
by rounding only: a few float32 ulps of values of order 1 (observed up to 2e-7). 1e-5 is 50x
that, and far below what a wrong mapping gives (a swapped, transposed or unloaded weight
changes whole activations, not their last bits).
"""

import pytest
import torch

from megatron.core import cpu_harness

transformers = pytest.importorskip("transformers")
pytest.importorskip("mbridge")

from mbridge import AutoBridge  # noqa: E402

from tests.integration.mbridge_cpu import build_models, deepseek_v3_bridge, use_local_specs  # noqa: E402

VOCAB, SEQ, TOLERANCE = 128, 16, 1e-5
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=64, tie_word_embeddings=False)


def qwen2():
    config = transformers.Qwen2Config(num_key_value_heads=2, **COMMON)
    return transformers.Qwen2ForCausalLM(config), AutoBridge.from_config


def qwen3_moe():
    config = transformers.Qwen3MoeConfig(
        num_key_value_heads=2, head_dim=16, moe_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        **COMMON,
    )
    return transformers.Qwen3MoeForCausalLM(config), AutoBridge.from_config


def deepseek_v3():
    # One dense layer, one MoE layer with a shared expert; MLA with a query LoRA. No MTP layer:
    # transformers' DeepSeek-V3 has none to compare with, and mbridge builds MTP with TE only.
    config = transformers.DeepseekV3Config(
        num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
        topk_group=1, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=16, rope_scaling=None, routed_scaling_factor=1.0, num_nextn_predict_layers=0,
        **COMMON,
    )
    return transformers.DeepseekV3ForCausalLM(config), deepseek_v3_bridge


@pytest.mark.parametrize("build", [qwen2, qwen3_moe, deepseek_v3], ids=lambda f: f.__name__)
def test_hf_to_fork_to_hf(build, tmp_path, monkeypatch):
    # TransformerConfig records its attention backend in these; DeepSeek-V3's bridge asks for
    # the fused one and refuses a choice an earlier config left behind.
    for name in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN"):
        monkeypatch.delenv(name, raising=False)
    torch.manual_seed(0)
    hf_model, make_bridge = build()
    hf_model = hf_model.float().eval()
    hf_model.save_pretrained(tmp_path)
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf_model(tokens).logits

    with cpu_harness.single_process(seed=1234):
        bridge = use_local_specs(make_bridge(hf_model.config, dtype=torch.float32))
        models = build_models(bridge, str(tmp_path))
        model = models[0].eval()
        positions = torch.arange(SEQ).expand(2, SEQ)
        mask = torch.triu(torch.ones(SEQ, SEQ), diagonal=1).bool()[None, None]
        with torch.no_grad():
            logits = model(tokens, positions, mask)
        exported = dict(bridge.export_weights(models))

    diff = (logits - expected).abs().max().item()
    print(f"{build.__name__}: max |fork - transformers| logits = {diff:.3e}")
    assert logits.shape == expected.shape
    assert diff <= TOLERANCE, diff
    hf_weights = hf_model.state_dict()
    assert sorted(exported) == sorted(hf_weights)
    changed = [name for name, value in hf_weights.items() if not torch.equal(exported[name], value)]
    assert changed == [], changed
