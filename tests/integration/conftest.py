"""Client-library tests: each runs inside ``megatron.core.cpu_harness`` and puts back every class
attribute that a client's monkey patch replaced, so the tests stay independent."""

import os

import pytest

from megatron.core import cpu_harness
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.tensor_parallel.random import CheckpointFunction
from megatron.core.transformer.moe import router as router_module
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.router_replay import RouterReplay
from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
from megatron.core.transformer.multi_latent_attention import MLASelfAttention, MultiLatentAttention
from megatron.core.transformer.multi_token_prediction import MultiTokenPredictionLayer
from megatron.core.transformer.transformer_config import TransformerConfig
from tests.integration.clients import ClassAttributes

PATCHED_BY_CLIENTS = [
    (GPTModel, "_postprocess"),
    (TopKRouter, "__init__"),
    (TopKRouter, "routing"),
    (TopKRouter, "_router_replay_patched"),
    (TopKRouter, "_hash_routing"),  # verl on a base with dev's hash router (upstream-dev line)
    (router_module, "RouterReplay"),  # the same: verl swaps the router module's RouterReplay
    (TransformerConfig, "__init__"),
    (TransformerConfig, "_verl_router_patched"),
    (MoEAlltoAllTokenDispatcher, "preprocess"),
    (MoEAlltoAllTokenDispatcher, "_preprocess_patched"),
    (CheckpointFunction, "backward"),
    (MultiTokenPredictionLayer, "_get_embeddings"),
    (MLASelfAttention, "get_query_key_value_tensors"),
    (MultiLatentAttention, "forward"),
]


@pytest.fixture(autouse=True)
def _rendezvous_env_restored():
    """``cpu_harness`` sets MASTER_ADDR/MASTER_PORT when they are unset and leaves them; later
    tests that start processes of their own must not inherit this test's port."""
    saved = {name: os.environ.get(name) for name in ("MASTER_ADDR", "MASTER_PORT")}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def harness():
    saved = ClassAttributes(PATCHED_BY_CLIENTS)
    RouterReplay.clear_global_router_replay_instances()
    with cpu_harness.single_process(seed=1234):
        try:
            yield
        finally:
            saved.restore()
            RouterReplay.clear_global_router_replay_action()
            RouterReplay.clear_global_router_replay_instances()
