"""Seeded scenarios the upstream oracle runs on pristine upstream and on the fork alike.

This module runs inside ``upstream_oracle``'s subprocesses, where ``megatron`` is whichever tree is
under test, so it uses only upstream 0.19 API; fork-only flags reach it as config fields or forward
arguments named by the caller. A scenario returns plain tensors: outputs, gradients, state dict.
"""

import json
import sys

import torch

SEQ, BATCH, VOCAB = 16, 2, 64


def _config(fields: dict):
    from megatron.core.transformer import TransformerConfig

    values = dict(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        use_cpu_initialization=True,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=False,
        params_dtype=torch.float32,
    )
    if fields.get("bf16"):
        values["params_dtype"] = torch.bfloat16
    values.update(fields)
    return TransformerConfig(**values)


def _mutate(mutation):
    """Deliberate fork-side bugs for the oracle's self-test (never used by parity tests)."""
    if mutation is None:
        return
    if mutation != "scale_layer_output":
        raise ValueError(f"unknown mutation {mutation!r}")
    from megatron.core.transformer.transformer_layer import TransformerLayer

    forward = TransformerLayer.forward
    if getattr(forward, "oracle_mutant", False):
        return

    def scaled(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        return (out[0] * 1.01, *out[1:]) if isinstance(out, tuple) else out * 1.01

    scaled.oracle_mutant = True
    TransformerLayer.forward = scaled


def _plain(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return None if value is None else type(value).__name__


class StandInGroupedLinear(torch.nn.Module):
    """Per-expert matmuls with Transformer Engine GroupedLinear's call signature, so upstream's
    grouped experts (TEGroupedMLP) run on the CPU, where TE is absent; seeded weights."""

    def __init__(self, num_gemms, in_features, out_features, *, config, bias, skip_bias_add, **_):
        super().__init__()
        gen = torch.Generator().manual_seed(in_features * 7 + out_features)
        weight = torch.randn(num_gemms, out_features, in_features, generator=gen) * 0.2
        self.weight = torch.nn.Parameter(weight.to(config.params_dtype))
        self.bias = None
        if bias:
            raise ValueError("StandInGroupedLinear: the scenarios build experts without bias")

    def forward(self, x, tokens_per_expert):
        sizes = [int(n) for n in tokens_per_expert]
        return torch.cat([c @ w.t() for c, w in zip(torch.split(x, sizes), self.weight)]), None


def _to_tf32(x):
    """fp32 rounded to TF32's 10 mantissa bits (round to nearest), as TF32 tensor cores read it."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def tf32_general_gemm(a, b, out_dtype, layout="TN", bias=None, grad=False, **_):
    """Transformer Engine's ``general_gemm`` at the precision its cuBLASLt GEMM gives fp32
    operands (TF32 products, fp32 sums), for the three layouts the router's gating linear uses."""
    a, b = _to_tf32(a), _to_tf32(b)
    out = {"TN": lambda: b @ a.t(), "NN": lambda: b @ a, "NT": lambda: b.t() @ a}[layout]()
    if bias is not None:
        out = out + bias.float()
    return (out.to(out_dtype),)


class _OneCPUStream:
    """``torch.cuda.Stream`` on the CPU, for the alltoall dispatcher's device-to-host side stream:
    one stream, everything on it already ordered, so waits and synchronizations are no-ops."""

    _the = None

    def __new__(cls, *args, **kwargs):
        if cls._the is None:
            cls._the = super().__new__(cls)
        return cls._the

    def wait_stream(self, stream):
        pass

    def record_event(self, event=None):
        return self  # an event that has already happened

    def synchronize(self):
        pass


def _cpu_streams():
    if not torch.cuda.is_available():
        from contextlib import nullcontext

        torch.cuda.Stream = torch.cuda.current_stream = _OneCPUStream
        torch.cuda.stream = lambda stream: nullcontext()


def _grouped_experts(spec):
    """``spec`` with its MoE layer's experts built as upstream's grouped experts (TEGroupedMLP over
    stand-in grouped linears) instead of the local spec's SequentialMLP."""
    from functools import partial

    from megatron.core.transformer.moe.experts import GroupedMLPSubmodules, TEGroupedMLP

    linears = GroupedMLPSubmodules(linear_fc1=StandInGroupedLinear, linear_fc2=StandInGroupedLinear)
    mlp = spec.submodules.mlp  # a ModuleSpec or a partial of MoELayer, by version
    moe = mlp.keywords["submodules"] if isinstance(mlp, partial) else mlp.submodules
    moe.experts = partial(TEGroupedMLP, submodules=linears)
    return spec


def gpt(config: dict, forward: dict, seed: int = 1234, experts: str = "sequential",
        router_gemm: str = "torch", update_expert_bias: bool = False):
    """A tiny GPTModel (local spec; MoE and MTP as ``config`` says): loss, logits, grads, state.

    ``experts="grouped"`` builds the routed experts as grouped experts (TEGroupedMLP);
    ``router_gemm="tf32"`` runs the router's gating GEMM at TE's precision for fp32 operands, as
    on a GPU with Transformer Engine (on the CPU it is otherwise an exact fp32 matmul);
    ``update_expert_bias`` runs the end-of-batch expert-bias update after the backward and reports
    the routers' expert biases after it (``outputs["expert_bias"]``)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if router_gemm not in ("torch", "tf32") or experts not in ("sequential", "grouped"):
        raise ValueError(f"gpt scenario: unknown router_gemm={router_gemm!r} or experts={experts!r}")
    if router_gemm == "tf32":
        from megatron.core.transformer.moe import moe_utils

        moe_utils.te_general_gemm = tf32_general_gemm
    _cpu_streams()
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    cfg = _config(config)
    spec = get_gpt_layer_local_spec(num_experts=cfg.num_moe_experts, moe_grouped_gemm=False)
    if experts == "grouped":
        spec = _grouped_experts(spec)
    mtp_spec = (get_gpt_mtp_block_spec(cfg, spec, use_transformer_engine=False)
                if cfg.mtp_num_layers else None)
    model = GPTModel(cfg, spec, vocab_size=VOCAB, max_sequence_length=SEQ, mtp_block_spec=mtp_spec)
    if cfg.bf16:  # as training wraps it: every parameter bf16, fp32 logits out
        from megatron.core.transformer.module import Float16Module

        model = Float16Module(cfg, model)
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    position_ids = torch.arange(SEQ).unsqueeze(0).expand(BATCH, SEQ)
    mask = torch.triu(torch.ones(SEQ, SEQ), diagonal=1).bool()[None, None]
    state = {k: _plain(v) for k, v in model.state_dict().items()}
    loss = model(tokens, position_ids, mask, labels=labels, **forward)
    loss.sum().backward()
    grads = {n: _plain(p.grad) for n, p in model.named_parameters()}
    biases = {}
    if update_expert_bias:
        from megatron.core.distributed.finalize_model_grads import _update_router_expert_bias

        _update_router_expert_bias([model], cfg)
        biases = {"expert_bias": torch.cat([
            m.expert_bias.detach().flatten() for m in model.modules()
            if getattr(m, "expert_bias", None) is not None
        ])}
    with torch.no_grad():
        logits = model(tokens, position_ids, mask, **forward)
    return {
        "outputs": {"loss": loss.detach(), "logits": logits.detach(), **biases},
        "grads": grads,
        "state_dict": state,
    }


def persistent_async_request(config: dict, forward: dict, seed: int = 1234):
    """What MCore's persistent async-save queue (``config``: its keyword arguments) hands to its
    worker for a request whose write buckets hold one tensor: the tensor and the preload step."""
    from functools import partial

    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue, AsyncRequest

    handed = []

    class RecordingCaller:
        def schedule_async_call(self, request):
            handed.append(request)

    calls = AsyncCallsQueue(persistent=True, **config)
    calls._get_async_caller = RecordingCaller
    tensor = torch.arange(6, dtype=torch.float32) + seed
    buckets = [("file", "key", ([], [("item", tensor)]))]
    preload = partial(list, buckets)
    calls.schedule_async_request(AsyncRequest(print, (0, buckets, None), [], preload_fn=preload))
    (request,) = handed
    sent = request.async_fn_args[1][0][2][1][0][1]
    return {
        "outputs": {
            "preload_fn_kept": request.preload_fn is preload,
            "same_tensor": sent is tensor,
            "sent": sent.clone(),
        },
        "grads": {},
        "state_dict": {},
    }


SCENARIOS = {"gpt": gpt, "persistent_async_request": persistent_async_request}


def main(specs_json: str, out: str) -> None:
    import megatron.core

    from tests.unit_tests import cpu_compat
    from tests.unit_tests.test_utilities import Utils

    specs = json.loads(specs_json)
    cpu_compat.install()
    Utils.initialize_model_parallel(1, 1)
    results = []
    for spec in specs:
        _mutate(spec.get("mutation"))
        result = SCENARIOS[spec["scenario"]](
            spec.get("config", {}), spec.get("forward", {}), **spec.get("options", {})
        )
        result["megatron_file"] = megatron.core.__file__
        results.append(result)
    Utils.destroy_model_parallel()
    torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
