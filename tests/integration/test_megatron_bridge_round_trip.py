"""HF -> fork -> HF through Megatron-Bridge 0.6.2 (``AutoBridge``) with TE layer specs, one GPU.

Tiny random-init float32 models are built locally with ``transformers`` 5.x (Megatron-Bridge
imports 5.x-only modules; ``gpu_clients.sh`` installs 5.12.1 for it): Qwen2 and Qwen3 (dense),
Qwen3-MoE, and DeepSeek-V3 (MLA + MoE) with one MTP layer, which transformers does not build, so
its weights are written into the checkpoint by ``hf_tiny.save_with_mtp_layers``. Each is saved,
built as a fork ``GPTModel`` by Megatron-Bridge's own provider (Transformer Engine specs, world
size 1), compared with ``transformers`` on the same tokens, and exported back: every exported
tensor must equal the checkpoint's bit for bit, the MTP ones included (named and counted).

Tolerance: the fork runs float32 on the GPU (TE GEMMs, TE's float32 attention, fused RoPE and
RMSNorm), ``transformers`` float32 on the CPU. In true float32 the two differ by summation order,
~1e-6 of the logits' scale. Should any GEMM run in TF32 (10-bit mantissa, relative rounding
2^-11 per input), a few layers compound to ~1e-3 of the scale. 1% of the largest reference logit
is 10x that, and far below what a wrong mapping gives (a swapped, transposed or unloaded weight
moves the logits by their own scale).
"""

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("Megatron-Bridge round trip: needs a CUDA device", allow_module_level=True)
if importlib.util.find_spec("transformer_engine") is None:
    pytest.skip("Megatron-Bridge round trip: needs Transformer Engine", allow_module_level=True)
transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(
        f"Megatron-Bridge 0.6.2 needs transformers>=5.8, found {transformers.__version__} "
        "(gpu_clients.sh installs both stacks: run with PYTHONPATH=...:/tmp/clients-mb)",
        allow_module_level=True,
    )
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip("Megatron-Bridge is not installed (tests/integration/gpu_clients.sh)", allow_module_level=True)

from megatron.bridge import AutoBridge  # noqa: E402

from tests.integration.hf_tiny import checkpoint_tensors, save_with_mtp_layers  # noqa: E402
from tests.unit_tests.test_utilities import Utils  # noqa: E402

VOCAB, SEQ, BATCH, RELATIVE_TOLERANCE = 128, 16, 2, 1e-2
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=64, tie_word_embeddings=False)


def qwen2():
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=2, **COMMON))


def qwen3():
    config = transformers.Qwen3Config(num_key_value_heads=2, head_dim=16, **COMMON)
    return transformers.Qwen3ForCausalLM(config)


def qwen3_moe():
    config = transformers.Qwen3MoeConfig(
        num_key_value_heads=2, head_dim=16, moe_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        **COMMON,
    )
    return transformers.Qwen3MoeForCausalLM(config)


def deepseek_v3_mtp():
    # One dense layer, one MoE layer with a shared expert, MLA with a query LoRA, one MTP layer
    # (an MoE layer, like the last decoder layer, as Megatron builds it).
    config = transformers.DeepseekV3Config(
        num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
        topk_group=1, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=16, rope_scaling=None, routed_scaling_factor=1.0, num_nextn_predict_layers=1,
        **COMMON,
    )
    return transformers.DeepseekV3ForCausalLM(config)


@pytest.fixture
def model_parallel(monkeypatch):
    # TransformerConfig records its attention backend in these; an earlier config's choice
    # must not carry over.
    for name in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    Utils.initialize_model_parallel(1, 1)
    yield
    Utils.destroy_model_parallel()


def fork_models(path):
    """Megatron-Bridge's provider for the checkpoint at ``path``: float32, TE specs, one GPU."""
    bridge = AutoBridge.from_hf_pretrained(str(path))
    provider = bridge.to_megatron_provider(load_weights=True)
    provider.params_dtype = torch.float32
    provider.bf16 = False
    provider.fp16 = False
    # Its default fuses wgrad accumulation through apex, which the fork does not need or ship.
    provider.gradient_accumulation_fusion = False
    provider.finalize()
    models = provider.provide_distributed_model(wrap_with_ddp=False)
    return bridge, models


def named_parameter(model, suffix):
    matches = [value for name, value in model.named_parameters() if name.endswith(suffix)]
    assert len(matches) == 1, (suffix, len(matches))
    return matches[0]


@pytest.mark.parametrize("build", [qwen2, qwen3, qwen3_moe, deepseek_v3_mtp], ids=lambda f: f.__name__)
def test_hf_to_fork_to_hf(build, tmp_path, model_parallel):
    torch.manual_seed(0)
    hf_model = build().float().eval()
    num_mtp = getattr(hf_model.config, "num_nextn_predict_layers", 0) or 0
    mtp = save_with_mtp_layers(hf_model, tmp_path) if num_mtp else {}
    if not num_mtp:
        hf_model.save_pretrained(tmp_path)
    checkpoint = checkpoint_tensors(tmp_path)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf_model(tokens).logits

    bridge, models = fork_models(tmp_path)
    model = models[0].eval()
    device = torch.device("cuda", torch.cuda.current_device())
    assert next(model.parameters()).device == device
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert any(
        type(module).__module__.startswith("megatron.core.extensions.transformer_engine")
        for module in model.modules()
    ), "the model was not built with Transformer Engine layers"
    positions = torch.arange(SEQ, device=device).expand(BATCH, SEQ)
    mask = torch.triu(torch.ones(SEQ, SEQ, device=device), diagonal=1).bool()[None, None]
    with torch.no_grad():
        logits = model(tokens.to(device), positions, mask)
    # Megatron pads the vocabulary (DeepSeek-V3's bridge to a multiple of 1280).
    logits = logits[..., :VOCAB].float().cpu()
    exported = dict(bridge.export_hf_weights(models, cpu=True, show_progress=False))

    diff = (logits - expected).abs().max().item()
    scale = expected.abs().max().item()
    print(f"{build.__name__}: max |fork - transformers| logits = {diff:.3e} (largest logit {scale:.3e})")
    assert logits.shape == expected.shape
    assert diff <= RELATIVE_TOLERANCE * scale, (diff, scale)

    assert sorted(exported) == sorted(checkpoint)
    changed = [name for name, value in checkpoint.items() if not torch.equal(exported[name].cpu(), value)]
    assert changed == [], changed

    mtp_exported = sorted(name for name in exported if name in mtp)
    print(f"{build.__name__}: {len(mtp_exported)} MTP tensors round-tripped: {mtp_exported}")
    assert mtp_exported == sorted(mtp)
    if num_mtp:
        # The MTP weights reached the fork's MTP layer itself, not only the export path.
        layer = COMMON["num_hidden_layers"]
        eh_proj = named_parameter(model, "mtp.layers.0.eh_proj.weight")
        assert torch.equal(eh_proj.detach().cpu(), mtp[f"model.layers.{layer}.eh_proj.weight"])
        assert len(mtp) >= 20  # MLA attention, MoE router + experts + shared expert, MTP norms
