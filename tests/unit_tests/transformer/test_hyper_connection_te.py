"""mHC + MTP with Transformer Engine layer specs against the local-spec model, same weights.

The TE spec fuses the input norm into the QKV projection and uses TE's linears and attention;
with mHC and an MTP layer, forward loss and every gradient must match the local-spec model
holding the same weights (fp32, TF32 off).
"""

import pytest
import torch

from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import SEQ, VOCAB, causal_batch
from tests.unit_tests.test_utilities import Utils
from tests.unit_tests.transformer.test_hyper_connection import mhc_mtp_config

# TE's fused LayerNorm-linear owns the norm that the local spec builds as its own module.
TE_TO_LOCAL = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
               "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias"}  # fmt: skip


def _local_name(te_name):
    for te_part, local_part in TE_TO_LOCAL.items():
        if te_name.endswith(te_part):
            return te_name[: -len(te_part)] + local_part
    return te_name


def _build(config, te):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

    if te:
        spec = get_gpt_layer_with_transformer_engine_spec(num_experts=config.num_moe_experts, moe_grouped_gemm=False)
    else:
        spec = get_gpt_layer_local_spec(num_experts=config.num_moe_experts, moe_grouped_gemm=False)
    mtp = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=te)
    return GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=SEQ, mtp_block_spec=mtp).cuda()


@pytest.mark.gpu
class TestHyperConnectionsMTPWithTESpecs:
    def setup_method(self, method):
        if not torch.cuda.is_available():
            pytest.skip("needs CUDA")
        pytest.importorskip("transformer_engine")
        Utils.initialize_model_parallel(1, 1)
        self._tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False

    def teardown_method(self, method):
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self._tf32
        Utils.destroy_model_parallel()

    @pytest.mark.parametrize("streams", [2, 4])
    def test_te_spec_matches_local_spec_with_the_same_weights(self, streams):
        from megatron.core import tensor_parallel

        config = mhc_mtp_config(mhc_num_residual_streams=streams, use_cpu_initialization=True)
        torch.manual_seed(3)
        tensor_parallel.model_parallel_cuda_manual_seed(3)
        local = _build(config, te=False)
        te_model = _build(config, te=True)
        local_params = dict(local.named_parameters())
        te_params = dict(te_model.named_parameters())
        mapped = {n: _local_name(n) for n in te_params}
        missing = sorted(n for n, m in mapped.items() if m not in local_params)
        assert not missing, f"TE parameters without a local counterpart: {missing}"
        assert sorted(mapped.values()) == sorted(local_params), "the two models hold different parameters"
        with torch.no_grad():
            for n, p in te_params.items():
                p.copy_(local_params[mapped[n]])
        assert any("hyper" in n.lower() or "mhc" in n.lower() for n in te_params), "mHC must be on"
        tokens, position_ids, mask = (t.cuda() for t in causal_batch(seed=1))
        losses = {}
        for name, model in (("local", local), ("te", te_model)):
            loss = model(tokens, position_ids, mask, labels=tokens)
            loss.mean().backward()
            losses[name] = loss.detach()
        torch.testing.assert_close(losses["te"], losses["local"], rtol=1e-4, atol=1e-4)
        for n, p in te_params.items():
            ref = local_params[mapped[n]].grad
            assert p.grad is not None and ref is not None, n
            torch.testing.assert_close(p.grad, ref, rtol=1e-3, atol=1e-4, msg=lambda m: f"{n}: {m}")
