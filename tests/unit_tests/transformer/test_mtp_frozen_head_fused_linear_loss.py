"""A frozen MTP head with upstream dev's fused linear cross-entropy (``cross_entropy_fusion_impl
="linear"``): ``process_mtp_loss`` then asks the output layer for the loss itself, passing
``output_cross_entropy_loss=True`` and ``labels``. With ``mtp_detach_heads`` (dev's) or
``mtp_detach_output_layer`` (the fork's) the head is the fork's ``FrozenOutputLayer``, which must
pass those arguments on: the MTP loss is the cross-entropy of the rolled labels, the head's
weight gets no gradient from it, and the MTP hidden states do.

On a base without the fused linear path (the pinned release) the tests skip.
"""

import typing

import pytest
import torch

from megatron.core.model_parallel_config import ModelParallelConfig
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.multi_token_prediction import process_mtp_loss
from tests.unit_tests.test_utilities import Utils, unit_device

pytestmark = pytest.mark.skipif(
    "linear" not in typing.get_args(ModelParallelConfig.__annotations__["cross_entropy_fusion_impl"]),
    reason="this base has no fused linear cross-entropy (cross_entropy_fusion_impl='linear')",
)

SEQ, BATCH, HIDDEN, VOCAB, MTP_LAYERS = 4, 2, 16, 11, 2


class LossHead(torch.nn.Module):
    """Stands in for dev's LinearCrossEntropyModule on the CPU: the same call signature, the
    loss computed unfused (per token, ``[b, s]``). Records the labels it was given."""

    def __init__(self, bias=False):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN))
        self.bias = torch.nn.Parameter(torch.randn(VOCAB)) if bias else None
        self.labels_seen = []

    def forward(self, hidden, weight=None, runtime_gather_output=None,
                output_cross_entropy_loss=False, labels=None):
        weight = self.weight if weight is None else weight
        logits = hidden @ weight.t()
        if self.bias is not None:
            logits = logits + self.bias
        if not output_cross_entropy_loss:
            return logits, None
        self.labels_seen.append(labels.clone())
        per_token = torch.nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), labels.transpose(0, 1).reshape(-1), reduction="none"
        )
        return per_token.view(SEQ, BATCH).transpose(0, 1)


class TestFrozenHeadWithFusedLinearLoss:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.parametrize("mode", ["mtp_detach_heads", "mtp_detach_output_layer"])
    @pytest.mark.parametrize("output_weight_given", [False, True], ids=["own-weight", "tied-weight"])
    @pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
    def test_frozen_head_passes_the_loss_arguments_on(self, mode, output_weight_given, bias):
        torch.manual_seed(3)
        config = TransformerConfig(
            num_layers=2, hidden_size=HIDDEN, num_attention_heads=2, mtp_num_layers=MTP_LAYERS,
            use_cpu_initialization=True, cross_entropy_loss_fusion=True,
            cross_entropy_fusion_impl="linear", **{mode: True},
        )
        device = unit_device()
        head = LossHead(bias=bias).to(device)
        tied = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN, device=device))
        weight = tied if output_weight_given else head.weight
        hidden = torch.randn((1 + MTP_LAYERS) * SEQ, BATCH, HIDDEN, device=device, requires_grad=True)
        labels = torch.randint(0, VOCAB, (BATCH, SEQ), device=device)

        out = process_mtp_loss(
            hidden_states=hidden, labels=labels, loss_mask=torch.ones(BATCH, SEQ, device=device),
            output_layer=head, output_weight=tied if output_weight_given else None,
            runtime_gather_output=None, is_training=False,
            compute_language_model_loss=None, config=config,
        )
        out.sum().backward()

        # One fused call per MTP layer, each with the labels rolled once more.
        assert len(head.labels_seen) == MTP_LAYERS
        for depth, seen in enumerate(head.labels_seen, start=1):
            torch.testing.assert_close(seen[:, : SEQ - depth], labels[:, depth:])
        # The head is frozen for the MTP loss; the MTP hidden states still get its gradient.
        assert weight.grad is None
        if bias:
            assert head.bias.grad is None
        mtp_grad = hidden.grad[SEQ:]
        assert mtp_grad.abs().sum() > 0
