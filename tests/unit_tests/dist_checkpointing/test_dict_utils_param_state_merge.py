"""`dict_utils.merge` on optimizer parameter-state lists of different lengths.

A dp_reshardable checkpoint written with another DP size (or by an older version) can store a
per-bucket list with more or fewer padding entries than the loading run builds, at the front,
between parameters or at the end. Such lists are merged by identity (the k-th parameter entry with
the k-th parameter entry), only when every padding entry carries no data; anything else must
still fail and name the offending element.
"""

import pytest
import torch

from megatron.core.dist_checkpointing.dict_utils import merge
from megatron.core.dist_checkpointing.legacy_compat import is_empty_padding_entry, is_padding_entry
from megatron.core.dist_checkpointing.mapping import LocalNonpersistentObject

BUCKET = ('optimizer', 'param_state', 0, torch.float32, 0)


def bucket_tree(entries):
    """The nesting the distributed optimizer uses: param_state[gbuf][dtype][bucket] = entries."""
    return {'optimizer': {'param_state': {0: {torch.float32: [entries]}}}}


def bucket_of(tree):
    return tree['optimizer']['param_state'][0][torch.float32][0]


class TestParamStateListMerge:
    def test_checkpoint_longer_drops_empty_padding(self):
        ckpt = bucket_tree(
            [{'padding': False}, {'padding': False}, {'padding': True}, {'padding': True}]
        )
        run = bucket_tree([{'exp_avg': torch.ones(2)}, {'exp_avg': torch.zeros(3)}])
        merged = bucket_of(merge(ckpt, run))
        assert len(merged) == 2
        assert merged[0]['padding'] is False and torch.equal(merged[0]['exp_avg'], torch.ones(2))
        assert merged[1]['padding'] is False and torch.equal(merged[1]['exp_avg'], torch.zeros(3))

    def test_run_longer_appends_empty_padding(self):
        ckpt = bucket_tree([{'step': 3}])
        run = bucket_tree(
            [{'exp_avg': torch.ones(2)}, {'padding': True}, {'padding': True, 'gap': []}]
        )
        merged = bucket_of(merge(ckpt, run))
        assert len(merged) == 3
        assert merged[0]['step'] == 3 and torch.equal(merged[0]['exp_avg'], torch.ones(2))
        assert merged[1] == {'padding': True}
        assert merged[2]['padding'] is True

    def test_empty_tensor_in_padding_is_no_data(self):
        ckpt = bucket_tree([{'a': 1}, {'padding': True, 'exp_avg': torch.empty(0)}])
        merged = bucket_of(merge(ckpt, bucket_tree([{'b': 2}])))
        assert merged == [{'a': 1, 'b': 2}]

    def test_checkpoint_padding_at_front_and_between_params_is_skipped(self):
        pad = {'padding': True}
        ckpt = bucket_tree([pad, {'step': 1}, dict(pad), {'step': 2}, dict(pad)])
        run = bucket_tree([{'exp_avg': torch.ones(2)}, {'exp_avg': torch.zeros(3)}])
        merged = bucket_of(merge(ckpt, run))
        assert [m['step'] for m in merged] == [1, 2]
        assert torch.equal(merged[0]['exp_avg'], torch.ones(2))
        assert torch.equal(merged[1]['exp_avg'], torch.zeros(3))

    def test_run_padding_between_params_keeps_the_run_layout(self):
        ckpt = bucket_tree([{'step': 1}, {'step': 2}])
        run = bucket_tree([{'padding': True}, {'a': 'p0'}, {'padding': True}, {'a': 'p1'}])
        merged = bucket_of(merge(ckpt, run))
        assert merged == [
            {'padding': True},
            {'step': 1, 'a': 'p0'},
            {'padding': True},
            {'step': 2, 'a': 'p1'},
        ]

    def test_both_sides_flagged_the_run_flag_wins(self):
        # As loaded: the run's entries always carry its (nonpersistent) padding flags.
        ckpt = bucket_tree(
            [{'padding': True}, {'padding': False, 'step': 1}, {'padding': False, 'step': 2}]
        )
        run = bucket_tree([{'padding': False, 'a': 'p0'}, {'padding': False, 'a': 'p1'}])
        merged = bucket_of(merge(ckpt, run))
        assert merged == [
            {'padding': False, 'step': 1, 'a': 'p0'},
            {'padding': False, 'step': 2, 'a': 'p1'},
        ]

    def test_equal_lengths_with_padding_elsewhere_are_matched_by_identity(self):
        ckpt = bucket_tree(
            [{'padding': True}, {'padding': False, 'step': 1}, {'padding': False, 'step': 2}]
        )
        run = bucket_tree(
            [{'padding': False, 'a': 'p0'}, {'padding': False, 'a': 'p1'}, {'padding': True}]
        )
        merged = bucket_of(merge(ckpt, run))
        assert merged == [
            {'padding': False, 'step': 1, 'a': 'p0'},
            {'padding': False, 'step': 2, 'a': 'p1'},
            {'padding': True},
        ]

    def test_a_missing_parameter_is_not_hidden_by_padding(self):
        # Paired by position, p0 would land on the run's second parameter and the error vanish.
        ckpt = bucket_tree([{'padding': True}, {'step': 'p0'}, {'padding': True}])
        run = bucket_tree([{'a': 'q0'}, {'a': 'q1'}])
        with pytest.raises(ValueError) as err:
            merge(ckpt, run)
        msg = str(err.value)
        assert '1 parameter entries, the second 2' in msg
        assert f"element {BUCKET + (1,)} of the second list has no counterpart" in msg
        assert len(bucket_of(ckpt)) == 3 and bucket_of(ckpt)[1] == {'step': 'p0'}

    @pytest.mark.parametrize('longer', ['first', 'second'])
    def test_more_parameters_on_one_side_names_the_unmatched_element(self, longer):
        # The unmatched parameter is not the list's last element: the error names that one.
        one, two = [{'step': 'p0'}], [{'step': 'p0'}, {'step': 'p1'}, {'padding': True}]
        ckpt, run = (two, one) if longer == 'first' else (one, two)
        with pytest.raises(ValueError) as err:
            merge(bucket_tree(ckpt), bucket_tree(run))
        assert f"element {BUCKET + (1,)} of the {longer} list has no counterpart" in str(err.value)

    def test_unflagged_checkpoint_of_the_same_length_is_merged_by_position(self):
        # An older run's checkpoint: its entries have no `padding` field (but, like every
        # dp_reshardable bucket list, one entry per parameter and per gap, each with its
        # `step`). Same length means the same bucket layout, and an unflagged list does not say
        # where its gaps are, so position is the only pairing it supports; the run's flags win.
        # The real dp_reshardable load relies on this too: one side of its merge carries no
        # `padding` field (see test_distrib_optimizer_dp_reshardable's DP round trips). Pairing
        # by identity would count three parameters against two and refuse the load.
        ckpt = bucket_tree([{'step': 'p0'}, {'step': 'gap'}, {'step': 'p1'}])
        run = bucket_tree(
            [{'padding': False, 'a': 'q0'}, {'padding': True}, {'padding': False, 'a': 'q1'}]
        )
        assert bucket_of(merge(ckpt, run)) == [
            {'step': 'p0', 'padding': False, 'a': 'q0'},
            {'step': 'gap', 'padding': True},
            {'step': 'p1', 'padding': False, 'a': 'q1'},
        ]

    def test_equal_lengths_unchanged(self):
        x1, x2 = bucket_tree([{'a': 1}, {'c': 3}]), bucket_tree([{'b': 2}, {'d': 4}])
        merged = bucket_of(merge(x1, x2))
        assert merged == [{'a': 1, 'b': 2}, {'c': 3, 'd': 4}]

    @pytest.mark.parametrize('checkpoint_longer', [True, False])
    def test_surplus_with_data_is_rejected_with_path(self, checkpoint_longer):
        short = [{'padding': False}]
        long = [{'padding': False}, {'padding': True}, {'padding': True, 'exp_avg': torch.ones(4)}]
        x1, x2 = (long, short) if checkpoint_longer else (short, long)
        tree1, tree2 = bucket_tree(x1), bucket_tree(x2)
        with pytest.raises(ValueError) as err:
            merge(tree1, tree2)
        msg = str(err.value)
        assert str(BUCKET + (2,)) in msg
        assert ('first' if checkpoint_longer else 'second') in msg
        assert 'exp_avg' in msg
        assert len(bucket_of(tree1)) == len(x1), "a failed merge must not modify its input"

    @pytest.mark.parametrize(
        'surplus',
        [
            {},  # no padding field: a parameter entry, not padding
            {'padding': False},
            {'padding': True, 'step': 5},
            {'padding': 'yes'},
            [],
        ],
    )
    def test_surplus_that_is_not_empty_padding_is_rejected(self, surplus):
        path = r"element .*'param_state', 0, torch.float32, 0, 1\)"
        with pytest.raises(ValueError, match=path):
            merge(bucket_tree([{'a': 1}, surplus]), bucket_tree([{'b': 2}]))

    def test_mismatch_outside_param_state_still_fails(self):
        with pytest.raises(ValueError, match='Cannot merge two lists with different lengths'):
            merge({'optimizer': {'state': [{'padding': True}, {}]}}, {'optimizer': {'state': [{}]}})
        with pytest.raises(ValueError, match='Cannot merge two lists with different lengths'):
            merge({'model': [1, {'padding': True}]}, {'model': [1]})


class TestPaddingEntryPredicates:
    def test_missing_padding_field_is_not_padding(self):
        assert not is_padding_entry({})
        assert not is_padding_entry({'exp_avg': torch.ones(1)})
        assert not is_empty_padding_entry({})

    def test_padding_flags(self):
        assert is_padding_entry({'padding': True})
        assert is_padding_entry({'padding': LocalNonpersistentObject(True)})
        assert not is_padding_entry({'padding': LocalNonpersistentObject(False)})
        assert not is_padding_entry({'padding': 1})
        assert is_empty_padding_entry({'padding': True, 'x': None, 'y': {}})
        assert not is_empty_padding_entry({'padding': True, 'param': torch.zeros(1)})
