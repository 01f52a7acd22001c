"""Guard for patch ``mtp-live-head-defer-wgrad-guard``.

With MTP layers whose loss still trains the output layer, ``defer_embedding_wgrad_compute``
pairs queued head inputs and output gradients in different orders and silently computes a wrong
output-layer gradient (shown by the strict xfail in
tests/unit_tests/tensor_parallel/test_layers_deferred_wgrad_frozen_weight.py, which sets the flag
after validation). Config validation must refuse that combination and keep the detached ones.
"""

import pytest
import torch

from megatron.core.transformer import TransformerConfig

BASE = dict(
    num_layers=2,
    hidden_size=32,
    num_attention_heads=4,
    pipeline_model_parallel_size=2,
    pipeline_dtype=torch.float32,
    gradient_accumulation_fusion=True,
    defer_embedding_wgrad_compute=True,
)


class TestMTPDeferredWgradGuard:
    def test_live_mtp_head_with_deferral_is_rejected(self):
        with pytest.raises(ValueError, match=r"defer_embedding_wgrad_compute=True with MTP layers needs mtp_detach_output_layer") as info:
            TransformerConfig(mtp_num_layers=1, **BASE)
        assert "silently computes a wrong output-layer gradient" in str(info.value)

    @pytest.mark.parametrize("detach", ["mtp_detach_output_layer", "mtp_detach_heads"])
    def test_detached_heads_with_deferral_are_accepted(self, detach):
        config = TransformerConfig(mtp_num_layers=1, **{detach: True}, **BASE)
        assert config.defer_embedding_wgrad_compute and getattr(config, detach)

    def test_deferral_without_mtp_is_unaffected(self):
        assert TransformerConfig(**BASE).defer_embedding_wgrad_compute
