"""The MTP loss-mask contract when MTP labels are derived from ``input_ids`` (RL, labels=None).

``loss_mask`` must be token-aligned with ``input_ids``: same shape, 1 on the tokens to predict
(the response tokens of each packed ``[prompt; response]`` sequence). Then at MTP depth k only
positions i whose target token i + k + 1 is a response token of the same packed sequence count,
and no label or mask crosses a ``cu_seqlens`` boundary. A mask of another shape (the verl bug:
a response-only mask handed to a packed batch) is an error.
"""

import inspect

import pytest
import torch

from megatron.core import tensor_parallel
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.multi_token_prediction import process_mtp_loss
from tests.unit_tests.test_utilities import Utils
from tests.unit_tests.transformer.mtp_testing import (
    VOCAB,
    build_model,
    causal_batch,
    deterministic_config,
    reset_mtp_state,
)

HIDDEN = 32
# (prompt length, response length) of each packed sequence.
PACKED = [(3, 2), (2, 5), (4, 3), (1, 1)]


class _Head(torch.nn.Module):
    """A bias-free linear output layer with the ColumnParallelLinear call signature."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN) * 0.2)

    def forward(self, x, weight=None, runtime_gather_output=None):
        return torch.nn.functional.linear(x, self.weight if weight is None else weight), None


class _RecordingLoss:
    def __init__(self):
        self.labels = []

    def __call__(self, labels, logits):
        self.labels.append(labels.clone())
        loss = tensor_parallel.vocab_parallel_cross_entropy(
            logits.clone(), labels.transpose(0, 1).contiguous()
        )
        return loss.transpose(0, 1)


def _packed_batch():
    lengths = [p + r for p, r in PACKED]
    total = sum(lengths)
    assert total < VOCAB
    # Token id j + 1 at position j: a label's value names the position it came from.
    input_ids = torch.arange(1, total + 1).unsqueeze(0)
    loss_mask = torch.cat(
        [torch.cat([torch.zeros(p), torch.ones(r)]) for p, r in PACKED]
    ).unsqueeze(0)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    params = PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        max_seqlen_q=max(lengths),
        max_seqlen_kv=max(lengths),
    )
    seq_of = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return input_ids, loss_mask, params, seq_of


def _expected(loss_mask, seq_of, depth):
    """Depth-k mask and label positions, computed from the contract alone."""
    total = loss_mask.shape[-1]
    mask = torch.zeros(total)
    source = torch.full((total,), -1)
    for i in range(total):
        j = i + depth + 1
        if j < total and seq_of[j] == seq_of[i] and loss_mask[0, j] == 1:
            mask[i] = 1
            source[i] = j
    return mask, source


def _roll_once(tensor, packed_seq_params):
    """One per-sequence roll by -1 through the base's own roll_tensor.

    megatron-core 0.19.2 takes one tensor and returns ``(rolled, sum)``; upstream dev takes a list
    of tensors rolled together and returns the list of rolled tensors.
    """
    from megatron.core.transformer.multi_token_prediction import roll_tensor

    first = next(iter(inspect.signature(roll_tensor).parameters))
    if first not in ("tensor", "tensors"):
        raise TypeError(f"roll_tensor's first parameter is {first!r}: neither 0.19.2's nor dev's form")
    if first == "tensors":
        (rolled,) = roll_tensor([tensor], packed_seq_params=packed_seq_params)
        return rolled
    rolled, _ = roll_tensor(tensor, packed_seq_params=packed_seq_params)
    return rolled


class TestMTPLossMaskContract:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        reset_mtp_state()

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def _run(self, depth, loss_mask, input_ids, packed_seq_params=None):
        config = deterministic_config(hidden_size=HIDDEN, mtp_num_layers=depth)
        total = input_ids.shape[-1]
        torch.manual_seed(0)
        hidden = torch.randn((1 + depth) * total, 1, HIDDEN, requires_grad=True)
        loss_fn = _RecordingLoss()
        out = process_mtp_loss(
            hidden_states=hidden,
            labels=None,
            loss_mask=loss_mask,
            output_layer=_Head(),
            output_weight=None,
            runtime_gather_output=None,
            is_training=False,
            compute_language_model_loss=loss_fn,
            config=config,
            packed_seq_params=packed_seq_params,
            input_ids=input_ids,
        )
        assert out.shape == (total, 1, HIDDEN)
        (out * 0).sum().backward()
        per_depth_grad = hidden.grad.abs().sum(-1).squeeze(-1).view(1 + depth, total)
        return loss_fn.labels, per_depth_grad

    @pytest.mark.parametrize("depth", [1, 2])
    def test_packed_sequences_count_only_same_sequence_response_targets(self, depth):
        input_ids, loss_mask, params, seq_of = _packed_batch()
        labels, grads = self._run(depth, loss_mask, input_ids, params)
        assert len(labels) == depth
        assert grads[0].abs().sum() == 0, "the main chunk gets no MTP gradient"
        for k in range(1, depth + 1):
            expected_mask, source = _expected(loss_mask, seq_of, k)
            assert expected_mask.sum() > 0
            counted = (grads[k] > 0).float()
            assert torch.equal(counted, expected_mask), (
                f"depth {k}: counted positions {counted.nonzero().flatten().tolist()}, "
                f"expected {expected_mask.nonzero().flatten().tolist()}"
            )
            # Each counted position predicts the token k + 1 ahead in its own sequence.
            got = labels[k - 1][0]
            where = expected_mask.bool()
            assert torch.equal(got[where], input_ids[0][source[where]])
            assert (seq_of[source[where]] == seq_of[where]).all()

    def test_response_only_mask_is_rejected(self):
        input_ids, loss_mask, params, _ = _packed_batch()
        response_only = loss_mask[:, loss_mask[0] == 1]
        with pytest.raises(ValueError) as error:
            self._run(1, response_only, input_ids, params)
        message = str(error.value)
        assert "loss_mask must be token-aligned" in message
        assert str(tuple(input_ids.shape)) in message and str(tuple(response_only.shape)) in message

    def test_derived_labels_match_explicit_rolled_labels(self):
        # Deriving from input_ids is the same as passing labels rolled once per sequence with
        # the label-aligned (rolled) mask.
        input_ids, loss_mask, params, _ = _packed_batch()
        config = deterministic_config(hidden_size=HIDDEN, mtp_num_layers=1)
        total = input_ids.shape[-1]
        hidden = torch.randn(2 * total, 1, HIDDEN, requires_grad=True)
        labels = _roll_once(input_ids, params)
        label_mask = _roll_once(loss_mask, params)
        derived = _RecordingLoss()
        explicit = _RecordingLoss()
        common = dict(
            hidden_states=hidden,
            output_layer=_Head(),
            output_weight=None,
            runtime_gather_output=None,
            is_training=False,
            config=config,
            packed_seq_params=params,
            input_ids=input_ids,
        )
        torch.manual_seed(1)
        process_mtp_loss(
            labels=None, loss_mask=loss_mask, compute_language_model_loss=derived, **common
        )
        torch.manual_seed(1)
        process_mtp_loss(
            labels=labels, loss_mask=label_mask, compute_language_model_loss=explicit, **common
        )
        assert torch.equal(derived.labels[0], explicit.labels[0])


class TestGPTModelLossMaskContract:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)
        reset_mtp_state()

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_mismatched_loss_mask_is_a_clear_error(self):
        model = build_model(deterministic_config())
        tokens, position_ids, mask = causal_batch()
        with pytest.raises(ValueError, match=r"input_ids of shape \(2, 16\).*got \(2, 10\)"):
            model(tokens, position_ids, mask, loss_mask=torch.ones(2, 10, device=tokens.device))
        # The token-aligned mask of the same shape is accepted, and compute_mtp=False does not
        # look at the mask at all.
        model(tokens, position_ids, mask, loss_mask=torch.ones(2, 16, device=tokens.device))
        short = torch.ones(2, 10, device=tokens.device)
        model(tokens, position_ids, mask, loss_mask=short, compute_mtp=False)
