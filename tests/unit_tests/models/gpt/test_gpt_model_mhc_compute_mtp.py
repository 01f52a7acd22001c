"""Cross-patch contract: the MTP-free forward (``compute_mtp=False``) with mHC models.

The mHC decoder returns ``(contracted_hidden, mhc_multistream)`` when MTP is on; an MTP-free
reference/log-prob forward must drop the multistream together with the MTP block and give the
logits of an mHC model built without MTP layers (same weights), bit for bit.
"""

import pytest
import torch

from megatron.core.models.gpt.mtp_free import load_state_dict_without_mtp, mtp_free_config
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import build_gpt, causal_batch
from tests.unit_tests.test_utilities import Utils
from tests.unit_tests.transformer.test_hyper_connection import mhc_mtp_config


class TestMHCWithComputeMTP:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.parametrize("detach", [{}, {"mtp_detach_output_layer": True}], ids=["live-head", "head-only-detach"])
    def test_mtp_free_forward_equals_mhc_model_without_mtp(self, detach):
        torch.manual_seed(7)
        model = build_gpt(mhc_mtp_config(**detach))
        torch.manual_seed(8)
        reference = build_gpt(mtp_free_config(model.config), with_mtp=False)
        dropped = load_state_dict_without_mtp(reference, model.state_dict())
        assert dropped and all(k.startswith("mtp.") for k in dropped)
        model.eval()
        reference.eval()

        calls = []
        handle = model.mtp.register_forward_pre_hook(lambda *a: calls.append(1))
        tokens, position_ids, mask = causal_batch()
        with torch.no_grad():
            logits = model(tokens, position_ids, mask, compute_mtp=False)
            expected = reference(tokens, position_ids, mask)
            assert not calls, "the MTP block ran although compute_mtp=False"
            assert torch.equal(logits, expected)
            # The default forward still runs MTP on the multistream.
            model(tokens, position_ids, mask, labels=tokens)
        assert calls
        handle.remove()

    def test_mtp_free_training_loss_has_no_mtp_gradient(self):
        torch.manual_seed(7)
        model = build_gpt(mhc_mtp_config())
        tokens, position_ids, mask = causal_batch()
        model(tokens, position_ids, mask, labels=tokens, compute_mtp=False).mean().backward()
        mtp_grads = [n for n, p in model.named_parameters() if n.startswith("mtp.") and p.grad is not None]
        assert not mtp_grads, f"MTP parameters got gradients without MTP: {mtp_grads}"
        decoder_grads = [n for n, p in model.named_parameters() if n.startswith("decoder.") and p.grad is not None]
        assert decoder_grads
