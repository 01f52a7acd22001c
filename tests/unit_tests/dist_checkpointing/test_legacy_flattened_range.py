"""ShardedTensor.flattened_range is accepted only behind the explicit legacy-load option."""

import logging

import pytest
import torch

from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing import legacy_compat
from megatron.core.dist_checkpointing.core import CheckpointingException
from megatron.core.dist_checkpointing.legacy_compat import (
    legacy_flattened_range_loading,
    legacy_flattened_range_loading_enabled,
    set_legacy_flattened_range_loading,
)
from megatron.core.dist_checkpointing.mapping import ShardedTensor
from tests.unit_tests.test_utilities import Utils


def flattened(key, data, flat, local_shape=(3, 4)):
    return ShardedTensor(
        key, data, data.dtype, local_shape, local_shape, (0, 0), (1, 1), flattened_range=flat
    )


@pytest.fixture
def fresh_log_once(monkeypatch):
    monkeypatch.setattr(legacy_compat, "_legacy_flattened_range_logged", False)


class TestLegacyFlattenedRange:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        set_legacy_flattened_range_loading(False)

    def teardown_method(self, method):
        set_legacy_flattened_range_loading(False)
        Utils.destroy_model_parallel()

    def test_rejected_by_default_and_error_names_the_option(self):
        assert not legacy_flattened_range_loading_enabled()
        with pytest.raises(CheckpointingException) as err:
            flattened("opt.exp_avg", torch.zeros(12), slice(0, 12))
        assert "legacy_flattened_range_loading" in str(err.value)
        assert "opt.exp_avg" in str(err.value)
        # Regular tensors are unaffected.
        ShardedTensor.from_rank_offsets("w", torch.zeros(3, 4))

    def test_accepted_with_option_and_logged_once(self, caplog, fresh_log_once):
        with caplog.at_level(logging.WARNING, logger=legacy_compat.__name__):
            with legacy_flattened_range_loading():
                assert legacy_flattened_range_loading_enabled()
                first = flattened("opt.exp_avg", torch.zeros(12), slice(0, 12))
                flattened("opt.exp_avg_sq", torch.zeros(12), slice(0, 12))
        assert first.flattened_range == slice(0, 12)
        records = [r for r in caplog.records if "flattened_range" in r.getMessage()]
        assert len(records) == 1, [r.getMessage() for r in records]
        assert "opt.exp_avg" in records[0].getMessage()
        assert not legacy_flattened_range_loading_enabled(), "the context must restore the flag"
        with pytest.raises(CheckpointingException):
            flattened("opt.exp_avg", torch.zeros(12), slice(0, 12))

    def test_partial_range_is_a_clear_error_even_with_option(self):
        with legacy_flattened_range_loading():
            msg = r"slice\(4, 8, None\).*covers only part"
            with pytest.raises(CheckpointingException, match=msg):
                flattened("opt.exp_avg", torch.zeros(4), slice(4, 8))

    @pytest.mark.slow
    def test_whole_range_round_trip_with_option(self, tmp_path):
        values = torch.arange(12, dtype=torch.float32)
        with legacy_flattened_range_loading():
            request = {"t": flattened("t", values.clone(), slice(0, 12))}
            dist_checkpointing.save(request, str(tmp_path))
            target = torch.zeros(12)
            loaded = dist_checkpointing.load(
                {"t": flattened("t", target, slice(0, 12))}, str(tmp_path)
            )
        assert torch.equal(loaded["t"].reshape(-1), values)
        assert torch.equal(target, values), "the load must fill the requested tensor in place"
        # Without the option, the same request cannot even be built.
        with pytest.raises(CheckpointingException, match="legacy_flattened_range_loading"):
            flattened("t", torch.zeros(12), slice(0, 12))
