"""Tiny random-init Hugging Face checkpoints for the bridge round trips, MTP weights included.

transformers' DeepSeek-V3 builds no multi-token-prediction layer (it ignores ``model.layers.{N}``
when loading), but DeepSeek-V3 checkpoints carry one: a whole decoder layer at index
``num_hidden_layers`` plus ``enorm``, ``hnorm``, ``eh_proj`` and ``shared_head.norm``.
``save_with_mtp_layers`` writes such a checkpoint: the model's own weights, then random MTP
tensors named and shaped as DeepSeek-V3's are (the decoder part taken from a model one layer
deeper, so every shape is transformers' own).
"""

import os
import tempfile

import torch
from safetensors.torch import load_file, save_file

MTP_OWN_NORMS = ("enorm.weight", "hnorm.weight", "shared_head.norm.weight")


def _noisy_ones(size, generator):
    return 1.0 + 0.1 * torch.randn(size, generator=generator)


def checkpoint_tensors(directory) -> dict:
    """Every tensor of an unsharded safetensors checkpoint, by its checkpoint name."""
    weights_file = os.path.join(directory, "model.safetensors")
    if not os.path.exists(weights_file):
        raise FileNotFoundError(f"{weights_file}: expected one unsharded safetensors file")
    return load_file(weights_file)


def mtp_tensors(model_class, config, num_mtp_layers: int, seed: int = 7) -> dict:
    """Random MTP weights for ``config``'s model, keyed by their checkpoint names."""
    generator = torch.Generator().manual_seed(seed)
    layers = config.num_hidden_layers
    deeper = type(config).from_dict({**config.to_dict(), "num_hidden_layers": layers + num_mtp_layers})
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as scratch:
        # Saved, not state_dict(): transformers 5 keeps experts fused in memory and writes them
        # per expert, and a checkpoint holds what save_pretrained writes.
        model_class(deeper).float().save_pretrained(scratch)
        donor = checkpoint_tensors(scratch)
    hidden = config.hidden_size
    tensors = {}
    for index in range(layers, layers + num_mtp_layers):
        prefix = f"model.layers.{index}."
        tensors.update({name: value.clone() for name, value in donor.items() if name.startswith(prefix)})
        for norm in MTP_OWN_NORMS:
            tensors[prefix + norm] = _noisy_ones(hidden, generator)
        tensors[prefix + "eh_proj.weight"] = 0.02 * torch.randn(hidden, 2 * hidden, generator=generator)
    return tensors


def save_with_mtp_layers(hf_model, directory) -> dict:
    """Save ``hf_model`` plus its config's ``num_nextn_predict_layers`` MTP layers in one
    safetensors file; returns the MTP tensors."""
    num_mtp_layers = getattr(hf_model.config, "num_nextn_predict_layers", 0) or 0
    if num_mtp_layers < 1:
        raise ValueError("save_with_mtp_layers: the config sets no num_nextn_predict_layers")
    hf_model.save_pretrained(directory)
    extra = mtp_tensors(type(hf_model), hf_model.config, num_mtp_layers)
    weights = checkpoint_tensors(directory)
    dtype = next(iter(weights.values())).dtype
    extra = {name: value.to(dtype) for name, value in extra.items()}
    clash = sorted(set(weights) & set(extra))
    if clash:
        raise ValueError(f"MTP names already in the checkpoint: {clash[:3]}")
    save_file({**weights, **extra}, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    return extra
