"""The state dict the release line's GPT model with mHC and one MTP layer writes (data only).

Model: ``tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu.build_gpt`` with
``tiny_moe_mtp_config(enable_mhc_connections=True, mhc_num_residual_streams=2, hidden_dropout=0,
attention_dropout=0, mtp_num_layers=1, num_moe_experts=None)`` (2 layers, hidden 32, local spec).
Each entry is ``(key, shape)``, ``None`` for a TE-style ``_extra_state`` the local spec leaves
empty. ``test_mhc_convert.py::TestUpstreamDevNames::test_fork_model_writes_the_pinned_names``
checks that the release line's model writes exactly these, so the upstream-dev line (which has no
such model) can test its converter on them (``test_mhc_convert_dev.py``).
"""

NUM_STREAMS = 2
HIDDEN = 32

RELEASE_KEYS = (
    ('embedding.word_embeddings.weight', (64, 32)),
    ('embedding.position_embeddings.weight', (16, 32)),
    ('decoder.layers.0.input_layernorm.weight', (32,)),
    ('decoder.layers.0.input_layernorm.bias', (32,)),
    ('decoder.layers.0.self_attention.linear_proj.weight', (32, 32)),
    ('decoder.layers.0.self_attention.linear_proj._extra_state', None),
    ('decoder.layers.0.self_attention.linear_qkv.weight', (96, 32)),
    ('decoder.layers.0.self_attention.linear_qkv._extra_state', None),
    ('decoder.layers.0.pre_mlp_layernorm.weight', (32,)),
    ('decoder.layers.0.pre_mlp_layernorm.bias', (32,)),
    ('decoder.layers.0.mlp.linear_fc1.weight', (128, 32)),
    ('decoder.layers.0.mlp.linear_fc1._extra_state', None),
    ('decoder.layers.0.mlp.linear_fc2.weight', (32, 128)),
    ('decoder.layers.0.mlp.linear_fc2._extra_state', None),
    ('decoder.layers.0.self_attention_hyper_connection.mapping_weight', (8, 64)),
    ('decoder.layers.0.self_attention_hyper_connection.alpha_pre', (1,)),
    ('decoder.layers.0.self_attention_hyper_connection.alpha_post', (1,)),
    ('decoder.layers.0.self_attention_hyper_connection.alpha_res', (1,)),
    ('decoder.layers.0.self_attention_hyper_connection.mapping_bias', (8,)),
    ('decoder.layers.0.mlp_hyper_connection.mapping_weight', (8, 64)),
    ('decoder.layers.0.mlp_hyper_connection.alpha_pre', (1,)),
    ('decoder.layers.0.mlp_hyper_connection.alpha_post', (1,)),
    ('decoder.layers.0.mlp_hyper_connection.alpha_res', (1,)),
    ('decoder.layers.0.mlp_hyper_connection.mapping_bias', (8,)),
    ('decoder.layers.1.input_layernorm.weight', (32,)),
    ('decoder.layers.1.input_layernorm.bias', (32,)),
    ('decoder.layers.1.self_attention.linear_proj.weight', (32, 32)),
    ('decoder.layers.1.self_attention.linear_proj._extra_state', None),
    ('decoder.layers.1.self_attention.linear_qkv.weight', (96, 32)),
    ('decoder.layers.1.self_attention.linear_qkv._extra_state', None),
    ('decoder.layers.1.pre_mlp_layernorm.weight', (32,)),
    ('decoder.layers.1.pre_mlp_layernorm.bias', (32,)),
    ('decoder.layers.1.mlp.linear_fc1.weight', (128, 32)),
    ('decoder.layers.1.mlp.linear_fc1._extra_state', None),
    ('decoder.layers.1.mlp.linear_fc2.weight', (32, 128)),
    ('decoder.layers.1.mlp.linear_fc2._extra_state', None),
    ('decoder.layers.1.self_attention_hyper_connection.mapping_weight', (8, 64)),
    ('decoder.layers.1.self_attention_hyper_connection.alpha_pre', (1,)),
    ('decoder.layers.1.self_attention_hyper_connection.alpha_post', (1,)),
    ('decoder.layers.1.self_attention_hyper_connection.alpha_res', (1,)),
    ('decoder.layers.1.self_attention_hyper_connection.mapping_bias', (8,)),
    ('decoder.layers.1.mlp_hyper_connection.mapping_weight', (8, 64)),
    ('decoder.layers.1.mlp_hyper_connection.alpha_pre', (1,)),
    ('decoder.layers.1.mlp_hyper_connection.alpha_post', (1,)),
    ('decoder.layers.1.mlp_hyper_connection.alpha_res', (1,)),
    ('decoder.layers.1.mlp_hyper_connection.mapping_bias', (8,)),
    ('decoder.final_layernorm.weight', (32,)),
    ('decoder.final_layernorm.bias', (32,)),
    ('decoder.hc_head.hc_head_fn', (2, 64)),
    ('decoder.hc_head.hc_head_base', (2,)),
    ('decoder.hc_head.hc_head_scale', (1,)),
    ('mtp.layers.0.enorm.weight', (32,)),
    ('mtp.layers.0.enorm.bias', (32,)),
    ('mtp.layers.0.hnorm.weight', (32,)),
    ('mtp.layers.0.hnorm.bias', (32,)),
    ('mtp.layers.0.eh_proj.weight', (32, 64)),
    ('mtp.layers.0.eh_proj._extra_state', None),
    ('mtp.layers.0.mtp_model_layer.input_layernorm.weight', (32,)),
    ('mtp.layers.0.mtp_model_layer.input_layernorm.bias', (32,)),
    ('mtp.layers.0.mtp_model_layer.self_attention.linear_proj.weight', (32, 32)),
    ('mtp.layers.0.mtp_model_layer.self_attention.linear_proj._extra_state', None),
    ('mtp.layers.0.mtp_model_layer.self_attention.linear_qkv.weight', (96, 32)),
    ('mtp.layers.0.mtp_model_layer.self_attention.linear_qkv._extra_state', None),
    ('mtp.layers.0.mtp_model_layer.pre_mlp_layernorm.weight', (32,)),
    ('mtp.layers.0.mtp_model_layer.pre_mlp_layernorm.bias', (32,)),
    ('mtp.layers.0.mtp_model_layer.mlp.linear_fc1.weight', (128, 32)),
    ('mtp.layers.0.mtp_model_layer.mlp.linear_fc1._extra_state', None),
    ('mtp.layers.0.mtp_model_layer.mlp.linear_fc2.weight', (32, 128)),
    ('mtp.layers.0.mtp_model_layer.mlp.linear_fc2._extra_state', None),
    ('mtp.layers.0.mtp_model_layer.self_attention_hyper_connection.mapping_weight', (8, 64)),
    ('mtp.layers.0.mtp_model_layer.self_attention_hyper_connection.alpha_pre', (1,)),
    ('mtp.layers.0.mtp_model_layer.self_attention_hyper_connection.alpha_post', (1,)),
    ('mtp.layers.0.mtp_model_layer.self_attention_hyper_connection.alpha_res', (1,)),
    ('mtp.layers.0.mtp_model_layer.self_attention_hyper_connection.mapping_bias', (8,)),
    ('mtp.layers.0.mtp_model_layer.mlp_hyper_connection.mapping_weight', (8, 64)),
    ('mtp.layers.0.mtp_model_layer.mlp_hyper_connection.alpha_pre', (1,)),
    ('mtp.layers.0.mtp_model_layer.mlp_hyper_connection.alpha_post', (1,)),
    ('mtp.layers.0.mtp_model_layer.mlp_hyper_connection.alpha_res', (1,)),
    ('mtp.layers.0.mtp_model_layer.mlp_hyper_connection.mapping_bias', (8,)),
    ('mtp.layers.0.final_layernorm.weight', (32,)),
    ('mtp.layers.0.final_layernorm.bias', (32,)),
    ('mtp.layers.0.hc_head.hc_head_fn', (2, 64)),
    ('mtp.layers.0.hc_head.hc_head_base', (2,)),
    ('mtp.layers.0.hc_head.hc_head_scale', (1,)),
    ('output_layer.weight', (64, 32)),
    ('output_layer._extra_state', None),
)


def synthetic_release_state_dict(seed: int = 0, res_noise: float = 0.0):
    """Values for :data:`RELEASE_KEYS` (fp32): norms near 1, small weights, the mHC biases at the
    fork's init (pre ``-log(n-1)``, post 0, residual logits 4 on the diagonal) plus ``res_noise``
    x N(0, 1) on every bias entry (0: init-like; 1: logits spread as after training), mapping
    gates in [0.1, 0.5] and projections of std 0.1, so the token-dependent part matters."""
    import math

    import torch

    gen = torch.Generator().manual_seed(seed)
    n = NUM_STREAMS

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    out = {}
    for key, shape in RELEASE_KEYS:
        name = key.rsplit(".", 1)[-1]
        if shape is None:
            out[key] = None
        elif name == "mapping_bias":
            bias = torch.zeros(shape)
            bias[:n] = -math.log(n - 1) if n > 1 else 0.0
            bias[2 * n :] = 4.0 * torch.eye(n).flatten()
            out[key] = bias + res_noise * randn(*shape)
        elif name.startswith("alpha_"):
            out[key] = 0.1 + 0.4 * torch.rand(shape, generator=gen)
        elif name in ("mapping_weight", "hc_head_fn"):
            out[key] = 0.1 * randn(*shape)
        elif name == "hc_head_base":
            out[key] = 0.5 * randn(*shape)
        elif name == "hc_head_scale" or (key.endswith("norm.weight")):
            out[key] = 1.0 + 0.1 * randn(*shape)
        elif name == "bias":
            out[key] = 0.02 * randn(*shape)
        else:
            out[key] = 0.05 * randn(*shape)
    return out
