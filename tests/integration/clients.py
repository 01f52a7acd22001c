"""Shared helpers for the client-library tests: a tiny fork model on the CPU, verl's patch modules.

verl's package ``__init__`` imports its trainer stack (Ray, tensordict, hydra, ...), none of which
its Megatron patch modules use: those need only torch and megatron. ``verl_module`` therefore
enters ``verl`` and its parent packages as bare packages over the installed files, so the patch
modules run exactly as installed without the trainer's dependencies. No verl code is copied.
"""

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types

import pytest
import torch

from examples.tiny_models import gpt, moe_config, token_batch
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer import TransformerConfig

VOCAB, SEQ, BATCH = 64, 8, 2


def verl_module(name: str):
    """Import ``verl.<...>`` without running the ``__init__`` of ``verl`` or its subpackages."""
    if "verl" in sys.modules:
        root = list(sys.modules["verl"].__path__)[0]
    else:
        spec = importlib.util.find_spec("verl")  # finds the package without importing it
        if spec is None or not spec.submodule_search_locations:
            pytest.skip("verl is not installed (tests/integration/install_clients.sh installs it)")
        root = list(spec.submodule_search_locations)[0]
    parts = name.split(".")
    for depth in range(1, len(parts)):
        package = ".".join(parts[:depth])
        if package not in sys.modules:
            path = os.path.join(root, *parts[1:depth])
            module = types.ModuleType(package)
            module.__path__ = [path]
            module.__spec__ = importlib.machinery.ModuleSpec(package, None, is_package=True)
            module.__spec__.submodule_search_locations = [path]
            sys.modules[package] = module
    return importlib.import_module(name)


def tiny_config(**overrides) -> TransformerConfig:
    """The examples' MoE + MTP config (examples/tiny_models.py), at half their hidden size."""
    return moe_config(**{"hidden_size": 32, **overrides})


def tiny_model(config: TransformerConfig, seed: int = 1234) -> GPTModel:
    """A two-layer MoE GPT with one MTP layer, local (non-TE) specs, on the CPU."""
    torch.manual_seed(seed)
    return gpt(config, vocab=VOCAB, seq_len=SEQ)


def batch(seed: int = 0):
    return token_batch(seed, batch=BATCH, seq_len=SEQ, vocab=VOCAB)


class ClassAttributes:
    """Snapshot of class attributes that a patcher replaces, put back exactly afterwards."""

    def __init__(self, targets):
        self.saved = [(cls, name, vars(cls).get(name, _ABSENT)) for cls, name in targets]
        init = vars(TransformerConfig)["__init__"]
        self.config_init_signature = vars(init).get("__signature__", _ABSENT)

    def restore(self):
        for cls, name, value in self.saved:
            if value is _ABSENT:
                if name in vars(cls):
                    delattr(cls, name)
            else:
                setattr(cls, name, value)
        init = vars(TransformerConfig)["__init__"]
        if self.config_init_signature is _ABSENT:
            vars(init).pop("__signature__", None)  # verl rewrites it on megatron's own function


_ABSENT = object()
