"""Key recovery after a torch_dist load accepts a bare io.BytesIO value (TE FP8 extra state).

Loaded ShardedObject values normally come back as a list with one entry per requesting state
dict entry. TE's FP8 `_extra_state` can come back as a bare io.BytesIO instead; recovering the
original keys must treat it as one value rather than fail on len().
"""

import io

import pytest
import torch

from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor
from megatron.core.dist_checkpointing.strategies.torch import (
    _replace_sharded_keys_with_state_dict_keys,
    _replace_state_dict_keys_with_sharded_keys,
)


def sharded_layer():
    return {
        "layer": {
            "weight": ShardedTensor.from_rank_offsets("layer.weight", torch.zeros(2, 2)),
            "_extra_state": ShardedObject("layer._extra_state", io.BytesIO(), (1,), (0,)),
        }
    }


class TestKeyRecovery:
    def test_bare_bytesio_extra_state_is_recovered(self):
        grouped, flat_mapping, rename_mapping = _replace_state_dict_keys_with_sharded_keys(
            sharded_layer()
        )
        extra_key = ShardedObject("layer._extra_state", None, (1,), (0,)).unique_key
        assert set(grouped) == {"layer.weight", extra_key}

        fp8_meta = io.BytesIO(b"fp8 scaling state")
        weight = torch.arange(4.0).view(2, 2)
        recovered = _replace_sharded_keys_with_state_dict_keys(
            {"layer.weight": [weight], extra_key: fp8_meta}, flat_mapping, rename_mapping
        )
        assert recovered["layer"]["_extra_state"] is fp8_meta
        assert recovered["layer"]["weight"] is weight

    def test_list_values_unchanged_and_count_mismatch_names_key(self):
        _, flat_mapping, rename_mapping = _replace_state_dict_keys_with_sharded_keys(
            sharded_layer()
        )
        extra_key = ShardedObject("layer._extra_state", None, (1,), (0,)).unique_key
        wrapped = io.BytesIO(b"x")
        recovered = _replace_sharded_keys_with_state_dict_keys(
            {"layer.weight": [torch.ones(2, 2)], extra_key: [wrapped]}, flat_mapping, rename_mapping
        )
        assert recovered["layer"]["_extra_state"] is wrapped
        with pytest.raises(AssertionError, match="layer.weight: 2 loaded values for 1"):
            _replace_sharded_keys_with_state_dict_keys(
                {"layer.weight": [torch.ones(2, 2)] * 2, extra_key: [wrapped]},
                flat_mapping,
                rename_mapping,
            )
