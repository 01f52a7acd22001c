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

import importlib.util

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


def deepseek_v3_mtp_config():
    # deepseek_v3()'s model with one MTP layer (an MoE layer, like the last decoder layer).
    return transformers.DeepseekV3Config(
        num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
        topk_group=1, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=16, rope_scaling=None, routed_scaling_factor=1.0, num_nextn_predict_layers=1,
        **COMMON,
    )


@pytest.mark.gpu
def test_deepseek_v3_mtp_with_te_specs(tmp_path, monkeypatch):
    """DeepSeek-V3 with an MTP layer through mbridge with its own TE specs, float32 on one GPU.

    transformers builds no MTP layer, so ``hf_tiny`` writes one into the checkpoint; mbridge maps
    it with the ``mbridge_mtp`` recipe. The logits (the main head; the MTP block runs in the same
    forward) are compared with ``transformers`` on the CPU. Tolerance: as above, plus TE on the
    GPU: in true float32 the difference is summation order, ~1e-6 of the logits' scale; should
    a GEMM run in TF32 (relative rounding 2^-11) a few layers give ~1e-3 of it; 1% of the largest
    logit is 10x that and far below a wrong mapping's effect (the logits' own scale). mbridge
    asks for TE's fused (cuDNN) attention, which has no float32 kernel: ``attention_backend=
    "auto"`` (mbridge's ``set_extra_args``) lets TE take its float32 one.
    """
    if importlib.util.find_spec("transformer_engine") is None:
        pytest.skip("needs Transformer Engine (mbridge's default TE specs)")

    from tests.integration.hf_tiny import checkpoint_tensors, save_with_mtp_layers
    from tests.integration.mbridge_mtp import deepseek_v3_mtp_bridge
    from tests.unit_tests.test_utilities import Utils

    for name in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    torch.manual_seed(0)
    hf_model = transformers.DeepseekV3ForCausalLM(deepseek_v3_mtp_config()).float().eval()
    mtp = save_with_mtp_layers(hf_model, tmp_path)
    checkpoint = checkpoint_tensors(tmp_path)
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf_model(tokens).logits

    Utils.initialize_model_parallel(1, 1)
    try:
        bridge = deepseek_v3_mtp_bridge(hf_model.config, dtype=torch.float32)
        bridge.set_extra_args(attention_backend="auto")
        models = bridge.get_model(bf16=False, fp16=False, wrap_with_ddp=False)
        bridge.load_weights(models, str(tmp_path))
        model = models[0].eval()
        device = torch.device("cuda", torch.cuda.current_device())
        assert any(
            type(module).__module__.startswith("megatron.core.extensions.transformer_engine")
            for module in model.mtp.modules()
        ), "the MTP layer was not built with Transformer Engine layers"
        positions = torch.arange(SEQ, device=device).expand(2, SEQ)
        mask = torch.triu(torch.ones(SEQ, SEQ, device=device), diagonal=1).bool()[None, None]
        with torch.no_grad():
            logits = model(tokens.to(device), positions, mask)[..., :VOCAB].float().cpu()
        exported = {name: value.cpu() for name, value in bridge.export_weights(models)}
        eh_proj = dict(model.named_parameters())["mtp.layers.0.eh_proj.weight"].detach().cpu()
    finally:
        Utils.destroy_model_parallel()

    diff = (logits - expected).abs().max().item()
    scale = expected.abs().max().item()
    print(f"deepseek_v3_mtp (mbridge, TE): max |fork - transformers| logits = {diff:.3e} "
          f"(largest logit {scale:.3e})")
    assert logits.shape == expected.shape
    assert diff <= 1e-2 * scale, (diff, scale)
    assert sorted(exported) == sorted(checkpoint)
    changed = [name for name, value in checkpoint.items() if not torch.equal(exported[name], value)]
    assert changed == [], changed
    mtp_exported = sorted(name for name in exported if name in mtp)
    print(f"deepseek_v3_mtp (mbridge, TE): {len(mtp_exported)} MTP tensors round-tripped: {mtp_exported}")
    assert mtp_exported == sorted(mtp) and len(mtp) >= 20
    assert torch.equal(eh_proj, mtp[f"model.layers.{COMMON['num_hidden_layers']}.eh_proj.weight"])
