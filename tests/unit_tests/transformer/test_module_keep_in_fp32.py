"""``mark_keep_in_fp32``: a marked parameter stays fp32 when ``Float16Module`` casts the model to
bf16 or fp16, through DDP wrapping and a training step; unmarked tensors are cast exactly as
upstream's ``module.bfloat16()`` / ``module.half()`` cast them."""

import pytest
import torch

from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.transformer.module import Float16Module, mark_keep_in_fp32
from megatron.core.transformer.moe.router import Router
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import (
    build_gpt,
    causal_batch,
    tiny_moe_mtp_config,
)
from tests.unit_tests.test_utilities import Utils

HALF = {"bf16": torch.bfloat16, "fp16": torch.half}


def _model(precision, mark=True):
    config = tiny_moe_mtp_config(moe_router_dtype="fp32", **{precision: True})
    torch.manual_seed(7)
    model = build_gpt(config)
    gates = [m.weight for m in model.modules() if isinstance(m, Router)]
    if mark:
        assert all(mark_keep_in_fp32(g) is g for g in gates)
    return config, model, gates


class TestKeepInFp32:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.parametrize("precision", sorted(HALF))
    def test_marked_parameters_stay_fp32_under_float16_module(self, precision):
        config, model, gates = _model(precision)
        before = {id(g): g.detach().clone() for g in gates}
        wrapped = Float16Module(config, model)
        assert len(gates) == 3  # two decoder routers and the MTP router
        for name, param in wrapped.named_parameters():
            marked = any(param is g for g in gates)
            assert param.dtype == (torch.float32 if marked else HALF[precision]), name
        assert all(torch.equal(g, before[id(g)]) for g in gates)  # not rounded on the way

    @pytest.mark.parametrize("precision", sorted(HALF))
    def test_unmarked_model_is_cast_like_upstream(self, precision):
        config, model, _ = _model(precision, mark=False)
        wrapped = Float16Module(config, model)
        _, reference, _ = _model(precision, mark=False)
        reference = reference.half() if precision == "fp16" else reference.bfloat16()
        ours, theirs = wrapped.module.state_dict(), reference.state_dict()
        assert ours.keys() == theirs.keys()
        for key in ours:
            if isinstance(ours[key], torch.Tensor):
                assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), key

    @pytest.mark.parametrize("precision", sorted(HALF))
    def test_buffers_cast_like_upstream_except_marked(self, precision):
        """Every buffer, non-persistent and integer ones too (quantile balancing's ``long`` count),
        gets upstream's cast; a marked buffer stays fp32."""
        qb = dict(moe_router_load_balancing_type="quantile_balancing", moe_aux_loss_coeff=0.0)
        models = []
        for _ in range(2):
            config = tiny_moe_mtp_config(moe_router_dtype="fp32", **{precision: True}, **qb)
            torch.manual_seed(7)
            models.append(build_gpt(config))
        ours, reference = models
        # By name: a buffer the cast converts is a new tensor, not the one that was marked.
        marked = {n for n, b in ours.named_buffers() if n.endswith(".qb_beta")}
        for name, buffer in ours.named_buffers():
            if name in marked:
                assert mark_keep_in_fp32(buffer) is buffer
        assert marked
        ours = Float16Module(config, ours).module
        reference = reference.half() if precision == "fp16" else reference.bfloat16()
        theirs = dict(reference.named_buffers())
        names = {name for name, _ in ours.named_buffers()}
        assert names == set(theirs) and any(n.endswith("qb_beta_count") for n in names)
        for name, buffer in ours.named_buffers():
            if name in marked:
                assert buffer.dtype == torch.float32, name
                continue
            assert buffer.dtype == theirs[name].dtype and torch.equal(buffer, theirs[name]), name

    def test_marked_gate_trains_in_fp32_through_ddp(self):
        config, model, gates = _model("bf16")
        ddp = DistributedDataParallel(
            config, DistributedDataParallelConfig(), Float16Module(config, model)
        )
        assert all(g.dtype == torch.float32 and g.keep_in_fp32 for g in gates)
        tokens, position_ids, mask = causal_batch()
        ddp(tokens, position_ids, mask, labels=tokens).float().sum().backward()
        for gate in gates:
            assert gate.main_grad.dtype == torch.float32
            assert gate.main_grad.abs().sum() > 0
