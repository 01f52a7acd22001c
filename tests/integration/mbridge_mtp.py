"""mbridge 0.15.1's DeepSeek-V3 MTP weight names, for megatron-core 0.19 and any depth.

mbridge maps MTP weights only for the full 61-layer DeepSeek-V3 (``model.layers.61``, asserted)
and only under the MTP layer's old inner name ``mtp.layers.0.transformer_layer``, which
megatron-core renamed ``mtp_model_layer``. ``deepseek_v3_mtp_bridge`` maps MTP layer ``i`` to
checkpoint layer ``num_layers + i`` and reads its inner decoder layer's names with the bridge's
own decoder-layer mapping; everything else is mbridge's (and ``mbridge_cpu``'s 0.19 rename).
docs/rl-frameworks.md points users here.
"""

import re

from tests.integration.mbridge_cpu import deepseek_v3_bridge_class

MTP_WEIGHT = re.compile(r"^mtp\.layers\.(\d+)\.(.+)$")
INNER_LAYER = "mtp_model_layer."
# The MTP layer's own weights: megatron name -> DeepSeek-V3 checkpoint name (same layer index).
MTP_OWN = {
    "enorm.weight": "enorm.weight",
    "hnorm.weight": "hnorm.weight",
    "eh_proj.weight": "eh_proj.weight",
    "final_layernorm.weight": "shared_head.norm.weight",
}


def _convert_mtp_param(self, name: str) -> list:
    match = MTP_WEIGHT.match(name)
    if match is None:
        raise NotImplementedError(f"not an MTP weight: {name}")
    layer = self.config.num_layers + int(match.group(1))
    rest = match.group(2)
    if rest in MTP_OWN:
        return [f"model.layers.{layer}.{MTP_OWN[rest]}"]
    if not rest.startswith(INNER_LAYER):
        raise NotImplementedError(f"unknown MTP weight: {name}")
    return self._weight_name_mapping_mcore_to_hf(f"decoder.layers.{layer}.{rest[len(INNER_LAYER):]}")


def deepseek_v3_mtp_bridge(hf_config, **kwargs):
    """``mbridge_cpu.deepseek_v3_bridge`` with MTP weights mapped as above."""
    mapped = type("DeepseekV3BridgeOn019WithMtp", (deepseek_v3_bridge_class(),), {})
    mapped._convert_mtp_param = _convert_mtp_param
    return mapped(hf_config, **kwargs)
