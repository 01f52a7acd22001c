"""mbridge on the CPU: its bridges with megatron's local (non-TE) layer specs.

mbridge 0.15.1 always builds Transformer Engine specs and names weights after them (layer norms
fused into the next linear, ``linear_qkv.layer_norm_weight``). Without TE, the local spec keeps
those norms as modules of their own. ``use_local_specs`` builds the local spec and hands the bridge
the TE name of each local weight (norms, and SequentialMLP experts for grouped-GEMM ones);
everything else is the bridge's own mapping.
docs/rl-frameworks.md has the same recipe for users.
"""

import re

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

# local-spec parameter suffix -> the TE-spec name mbridge maps (tried only when the bridge has
# no mapping for the local name itself).
LOCAL_TO_TE_NAMES = (
    (".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight"),
    (".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight"),
    (".self_attention.q_layernorm.weight", ".self_attention.linear_q_up_proj.layer_norm_weight"),
    (".self_attention.kv_layernorm.weight", ".self_attention.linear_kv_up_proj.layer_norm_weight"),
)


# local SequentialMLP experts -> TE grouped-GEMM names (``linear_fc1.weight{expert}``).
LOCAL_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.weight$")


def te_name(bridge, name: str) -> str:
    """The TE-spec name of a local-spec weight, as far as the bridge needs it translated."""
    name = LOCAL_EXPERT.sub(r".mlp.experts.\2.weight\1", name)
    try:
        bridge._weight_name_mapping_mcore_to_hf(name)
        return name
    except NotImplementedError:
        for local, te in LOCAL_TO_TE_NAMES:
            if name.endswith(local):
                return name[: -len(local)] + te
        raise


def use_local_specs(bridge):
    """Make ``bridge`` build local-spec models and see their weights by TE names (one object)."""
    local_to_global = bridge._weight_name_mapping_mcore_local_to_global

    def layer_spec(vp_stage=None):
        return get_gpt_decoder_block_spec(
            bridge.config, use_transformer_engine=False, vp_stage=vp_stage
        )

    def names(model, *args, **kwargs):
        mapping = local_to_global(model, *args, **kwargs)
        return {local: te_name(bridge, name) for local, name in mapping.items()}

    # TE-only options: fused layer-norm kernels and grouped GEMM experts (local: SequentialMLP).
    bridge.config.persist_layer_norm = False
    bridge.config.moe_grouped_gemm = False
    bridge._get_transformer_layer_spec = layer_spec
    bridge._weight_name_mapping_mcore_local_to_global = names
    return bridge


def build_models(bridge, weights_dir):
    """``bridge.get_model`` on the CPU in float32, with the HF weights loaded.

    mbridge moves every module to ``torch.cuda.current_device()`` unless FSDP2 with CPU init is
    asked for; without DDP wrapping (``wrap_with_ddp=False``) that flag does nothing else.
    """
    models = bridge.get_model(
        bf16=False,
        fp16=False,
        wrap_with_ddp=False,
        use_cpu_initialization=True,
        use_torch_fsdp2=True,
    )
    bridge.load_weights(models, weights_dir)
    return models


def deepseek_v3_bridge_class():
    """mbridge's DeepSeek-V3 bridge with the MLA config field named as megatron-core 0.19 names it.

    The bridge passes ``max_position_embeddings`` (the YaRN original length) to
    ``MLATransformerConfig``; 0.19 calls that field ``original_max_position_embeddings``. For
    float32 checkpoints only (this bridge reads bfloat16 / FP8 ones otherwise).
    """
    from mbridge.core.bridge import Bridge
    from mbridge.models.deepseek_v3 import DeepseekV3Bridge

    from megatron.core.transformer.transformer_config import MLATransformerConfig

    def mla_config(**fields):
        if "max_position_embeddings" in fields:
            fields["original_max_position_embeddings"] = fields.pop("max_position_embeddings")
        return MLATransformerConfig(**fields)

    renamed = type("DeepseekV3BridgeOn019", (DeepseekV3Bridge,), {})
    renamed.TransformerConfigClass = staticmethod(mla_config)
    # Its reader dequantizes FP8 checkpoints and takes bfloat16 only; a float32 checkpoint
    # (the tiny test model) is read with mbridge's plain safetensors reader.
    renamed._get_safetensor_io = Bridge._get_safetensor_io
    return renamed


def deepseek_v3_bridge(hf_config, **kwargs):
    """An instance of ``deepseek_v3_bridge_class()``."""
    return deepseek_v3_bridge_class()(hf_config, **kwargs)
