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


def gpt(config: dict, forward: dict, seed: int = 1234):
    """A tiny GPTModel (local spec; MoE and MTP as ``config`` says): loss, logits, grads, state."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    cfg = _config(config)
    spec = get_gpt_layer_local_spec(num_experts=cfg.num_moe_experts, moe_grouped_gemm=False)
    mtp_spec = (get_gpt_mtp_block_spec(cfg, spec, use_transformer_engine=False)
                if cfg.mtp_num_layers else None)
    model = GPTModel(cfg, spec, vocab_size=VOCAB, max_sequence_length=SEQ, mtp_block_spec=mtp_spec)
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    position_ids = torch.arange(SEQ).unsqueeze(0).expand(BATCH, SEQ)
    mask = torch.triu(torch.ones(SEQ, SEQ), diagonal=1).bool()[None, None]
    state = {k: _plain(v) for k, v in model.state_dict().items()}
    loss = model(tokens, position_ids, mask, labels=labels, **forward)
    loss.sum().backward()
    grads = {n: _plain(p.grad) for n, p in model.named_parameters()}
    with torch.no_grad():
        logits = model(tokens, position_ids, mask, **forward)
    return {
        "outputs": {"loss": loss.detach(), "logits": logits.detach()},
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
        result = SCENARIOS[spec["scenario"]](spec.get("config", {}), spec.get("forward", {}))
        result["megatron_file"] = megatron.core.__file__
        results.append(result)
    Utils.destroy_model_parallel()
    torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
