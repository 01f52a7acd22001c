"""On a base with upstream's own mHC (upstream main): the fork's mHC and upstream's side by side.

One flag, two layer specs: a plain ``TransformerLayer`` spec runs the fork's model (its
``HyperConnection`` modules and learned head, the parameter names of fork checkpoints); a
``HyperConnectionTransformerLayer`` spec runs upstream's (``HyperConnectionModule``, the stream
mean at the end). A block uses exactly one of them. On megatron-core 0.19 (no upstream mHC) the
tests skip.
"""

import dataclasses

import pytest
import torch

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import hyper_connection
from megatron.core.transformer.transformer_block import TransformerBlock
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import BATCH, SEQ, causal_batch
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import tiny_moe_mtp_config
from tests.unit_tests.test_utilities import Utils

pytestmark = pytest.mark.skipif(
    not hasattr(hyper_connection, "HyperConnectionModule"), reason="no upstream mHC on this base"
)
N = 2


def dense_mhc_config(**overrides):
    values = dict(
        enable_mhc_connections=True,
        mhc_num_residual_streams=N,
        num_moe_experts=None,
        mtp_num_layers=None,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    values.update(overrides)
    return tiny_moe_mtp_config(**values)


def upstream_mhc_spec():
    """The local GPT layer spec with upstream's mHC layer and modules swapped in."""
    from megatron.core.transformer.transformer_layer import HyperConnectionTransformerLayer

    spec = get_gpt_layer_local_spec()
    submodules = dataclasses.replace(
        spec.submodules,
        self_attention_hyper_connection=hyper_connection.HyperConnectionModule,
        mlp_hyper_connection=hyper_connection.HyperConnectionModule,
    )
    return dataclasses.replace(spec, module=HyperConnectionTransformerLayer, submodules=submodules)


class TestTwoImplementations:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        torch.manual_seed(0)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_plain_layer_spec_builds_the_forks_model(self):
        block = TransformerBlock(dense_mhc_config(), get_gpt_layer_local_spec())
        names = {n for n, _ in block.named_parameters()}
        assert "layers.0.self_attention_hyper_connection.mapping_weight" in names
        assert "layers.1.mlp_hyper_connection.mapping_bias" in names
        assert {"hc_head.hc_head_fn", "hc_head.hc_head_base", "hc_head.hc_head_scale"} <= names
        assert not any("mapping_proj" in n for n in names), "upstream's modules built as well"
        assert hyper_connection.uses_fork_mhc(block)

    def test_upstream_layer_spec_builds_upstreams_model_only(self):
        block = TransformerBlock(dense_mhc_config(), upstream_mhc_spec())
        assert block.hc_head is None and not hyper_connection.uses_fork_mhc(block)
        for layer in block.layers:
            assert isinstance(layer.self_attention_hyper_connection, hyper_connection.HyperConnectionModule)
            assert isinstance(layer.mlp_hyper_connection, hyper_connection.HyperConnectionModule)
        names = {n for n, _ in block.named_parameters()}
        assert not any("mapping_weight" in n or "hc_head" in n for n in names), names

    def test_upstream_block_contracts_by_the_stream_mean_not_a_head(self):
        cfg = dense_mhc_config()
        block = TransformerBlock(cfg, upstream_mhc_spec(), post_process=True)
        block.final_layernorm = None  # see the contraction itself
        streams = {}
        block.layers[-1].register_forward_hook(lambda mod, args, out: streams.update(x=out[0]))
        x = torch.randn(SEQ, BATCH, cfg.hidden_size)
        _, _, mask = causal_batch()
        out = block(hidden_states=x, attention_mask=mask)
        last = streams["x"]
        assert last.shape == (SEQ, BATCH, N * cfg.hidden_size)
        torch.testing.assert_close(out, last.view(SEQ, BATCH, N, cfg.hidden_size).mean(dim=2))

    def test_mtp_with_upstreams_layer_is_refused_naming_the_forks_layer(self):
        cfg = dense_mhc_config(mtp_num_layers=1)
        with pytest.raises(ValueError, match="needs the fork's mHC layer"):
            TransformerBlock(cfg, upstream_mhc_spec())
