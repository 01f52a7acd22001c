"""Partial loading: a GPT + MoE checkpoint saved without MTP layers into a model with MTP.

RL recipes add MTP layers to a model whose checkpoint has none. Upstream's strictness option
(strict='log_unexpected'; --dist-ckpt-strictness in megatron.training) drops the keys the
checkpoint lacks from the load request and logs them. Without it the load fails, and the error
must point the user at that option.
"""

import logging

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.validation import StrictHandling
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import build_gpt, tiny_moe_mtp_config
from tests.unit_tests.test_utilities import Utils


def snapshot(model):
    return {n: t.detach().clone() for n, t in model.state_dict().items() if torch.is_tensor(t)}


class TestPartialLoadIntoMTPModel:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1, seed=1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.fixture
    def checkpoint_without_mtp(self, tmp_path):
        source = build_gpt(tiny_moe_mtp_config(mtp_num_layers=None), with_mtp=False)
        assert not any(n.startswith("mtp.") for n in source.state_dict())
        dist_checkpointing.save(source.sharded_state_dict(), str(tmp_path))
        return str(tmp_path), snapshot(source)

    def _mtp_model(self):
        Utils.initialize_model_parallel(1, 1, seed=2)  # different init from the source
        model = build_gpt(tiny_moe_mtp_config())
        assert model.mtp_process
        return model

    def test_log_unexpected_loads_all_but_mtp(self, checkpoint_without_mtp, caplog):
        ckpt_dir, source = checkpoint_without_mtp
        model = self._mtp_model()
        before = snapshot(model)
        with caplog.at_level(logging.WARNING):
            loaded = dist_checkpointing.load(
                model.sharded_state_dict(), ckpt_dir, strict=StrictHandling.LOG_UNEXPECTED
            )
        assert not any(k.startswith("mtp.") for k in loaded)
        assert any("mtp." in r.getMessage() for r in caplog.records), "skipped keys must be logged"
        result = model.load_state_dict(loaded, strict=False)
        missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
        assert missing and all(k.startswith("mtp.") for k in missing), missing
        assert not result.unexpected_keys

        after = snapshot(model)
        for name, value in after.items():
            if name.startswith("mtp."):
                assert torch.equal(value, before[name]), f"MTP weight {name} must keep its init"
            else:
                assert name in source, name
                assert torch.equal(value, source[name]), f"{name} not loaded from the checkpoint"
        assert any(n.startswith("mtp.") for n in after)
        # The checkpoint really differs from the fresh init, so equality above is meaningful.
        assert not torch.equal(before["output_layer.weight"], source["output_layer.weight"])

    def test_without_strictness_option_error_names_it(self, checkpoint_without_mtp):
        ckpt_dir, _ = checkpoint_without_mtp
        model = self._mtp_model()
        # torch's CheckpointException wraps the planner's KeyError (it derives from BaseException).
        with pytest.raises(CheckpointException) as err:
            dist_checkpointing.load(model.sharded_state_dict(), ckpt_dir)
        msg = str(err.value)
        assert "mtp." in msg and "not in state dict" in msg, msg[:2000]
        assert "strict=StrictHandling.LOG_UNEXPECTED" in msg, msg[-1000:]
        assert "--dist-ckpt-strictness log_unexpected" in msg, msg[-1000:]
