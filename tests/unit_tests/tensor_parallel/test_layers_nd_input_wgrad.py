"""ColumnParallelLinear's weight gradient for inputs with more than three dimensions.

The layer's forward is a matmul over the last dimension, so any number of leading dimensions
works; its backward flattened only 3-D tensors before the weight-gradient GEMM, and a 4-D input
(upstream dev's mHC MTP layer applies ``h_proj`` to ``[s, b, n, h]``, one row per residual
stream) died in ``grad_output.t()``. A 4-D input must give the gradients of the same rows
flattened to 3-D.
"""

import pytest
import torch

from megatron.core.tensor_parallel.layers import ColumnParallelLinear
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import prepare_input_tensors_for_wgrad_compute
from tests.unit_tests.test_utilities import Utils, unit_device


class TestColumnParallelLinearNDInput:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.parametrize("bias", [False, True])
    def test_4d_input_grads_equal_the_flattened_rows(self, bias):
        torch.manual_seed(0)
        config = TransformerConfig(
            num_layers=1, hidden_size=8, num_attention_heads=2, use_cpu_initialization=True
        )
        layer = ColumnParallelLinear(
            8, 6, config=config, init_method=torch.nn.init.normal_, bias=bias,
            gather_output=False, skip_bias_add=False,
        ).to(unit_device())
        x = torch.randn(5, 3, 4, 8, device=unit_device())  # [s, b, n, h]
        upstream = torch.randn(5, 3, 4, 6, device=unit_device())

        def grads(inp):
            layer.zero_grad(set_to_none=True)
            inp = inp.detach().requires_grad_(True)
            out, _ = layer(inp)
            (out * upstream.reshape(out.shape)).sum().backward()
            return out, inp.grad, [p.grad.clone() for p in layer.parameters()]

        out4, dx4, dparams4 = grads(x)
        out3, dx3, dparams3 = grads(x.reshape(5, 3 * 4, 8))

        assert out4.shape == (5, 3, 4, 6)
        torch.testing.assert_close(out4.reshape(out3.shape), out3)
        torch.testing.assert_close(dx4.reshape(dx3.shape), dx3)
        assert len(dparams4) == (2 if bias else 1)
        for got, want in zip(dparams4, dparams3):
            torch.testing.assert_close(got, want)


def test_prepare_input_tensors_flattens_every_leading_dimension():
    grad_output = torch.randn(2, 3, 4, 5)
    total_input = torch.randn(2, 3, 4, 7)
    grad_2d, input_2d = prepare_input_tensors_for_wgrad_compute(grad_output, total_input)
    assert grad_2d.shape == (24, 5) and input_2d.shape == (24, 7)
    torch.testing.assert_close(grad_2d.t() @ input_2d, torch.einsum("sbno,sbni->oi", grad_output, total_input))
