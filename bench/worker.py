"""One benchmark measurement in a fresh process: ``--impl`` decides which megatron is on the path."""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from bench.impl_path import import_megatron_from_env


def setup_distributed(device):
    """One-rank process group and Megatron's parallel state for a bench worker; returns the seed
    function. The group meets through a process-local store, not TCP: a port picked ahead of
    time can be taken before the worker binds it (by another bench or a test on the host, or by a
    sibling worker's NCCL bootstrap, which ended a bench on the H200), and one rank has no one to
    meet."""
    if device == "cpu":
        from tests.unit_tests import cpu_compat

        cpu_compat.install()
        import megatron.core

        # The fork's own stand-ins also cover CUDA streams (its layers open some). Looked up in the
        # imported tree itself: an editable install's finder would hand pristine upstream the fork's.
        if (Path(megatron.core.__file__).parent / "cpu_harness.py").is_file():
            from megatron.core.cpu_harness import install_cuda_stand_ins

            install_cuda_stand_ins()
    else:
        torch.cuda.set_device(0)
    backend = "nccl" if device == "cuda" else "gloo"
    torch.distributed.init_process_group(backend, store=torch.distributed.HashStore(), rank=0, world_size=1)
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    ps.initialize_model_parallel(1, 1)
    return model_parallel_cuda_manual_seed


def build(args, overrides):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.transformer import TransformerConfig

    dtype = torch.bfloat16 if args["device"] == "cuda" else torch.float32
    config = TransformerConfig(
        num_layers=args["layers"], hidden_size=args["hidden"], num_attention_heads=args["heads"],
        ffn_hidden_size=args["ffn"] or args["hidden"], num_moe_experts=args["experts"],
        moe_router_topk=args["topk"], moe_token_dispatcher_type=args.get("dispatcher", "allgather"),
        mtp_num_layers=1,
        add_bias_linear=False, bf16=dtype == torch.bfloat16, params_dtype=dtype,
        use_cpu_initialization=args["device"] == "cpu", moe_grouped_gemm=False,
        **overrides,
    )
    spec = get_gpt_layer_local_spec(num_experts=args["experts"], moe_grouped_gemm=False)
    mtp = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False)
    model = GPTModel(config, spec, vocab_size=args["vocab"], max_sequence_length=args["seq"], mtp_block_spec=mtp)
    return model.to(device=args["device"], dtype=dtype)


def batch(args):
    gen = torch.Generator().manual_seed(args["seed"])
    tokens = torch.randint(0, args["vocab"], (args["batch"], args["seq"]), generator=gen).to(args["device"])
    position_ids = torch.arange(args["seq"], device=args["device"]).unsqueeze(0).expand_as(tokens)
    mask = torch.triu(torch.ones(args["seq"], args["seq"], device=args["device"]), 1).bool()[None, None]
    return tokens, position_ids, mask


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def gib(n):
    return n / 2**30


def measure(args, scenario):
    device = args["device"]
    seed_fn = setup_distributed(device)
    seed_fn(args["seed"])
    torch.manual_seed(args["seed"])
    model = build(args, scenario.get("config", {}))
    tokens, position_ids, mask = batch(args)
    mode = scenario["mode"]
    fwd_kwargs = scenario.get("forward", {})
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    replay = None
    if mode == "train-replay":
        from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

        RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)
        with torch.no_grad():
            model(tokens, position_ids, mask)
        recorded = RouterReplay.get_recorded_data()
        RouterReplay.clear_global_router_replay_action()
        replay = (RouterReplay, RouterReplayAction, recorded)

    def train_step():
        if replay:
            rr, action, recorded = replay
            rr.set_replay_data(recorded)
            rr.set_global_router_replay_action(action.REPLAY_FORWARD)
        loss = model(tokens, position_ids, mask, labels=tokens, **fwd_kwargs)
        loss.float().mean().backward()
        sync(device)
        after_backward = torch.cuda.memory_allocated() if device == "cuda" else 0
        if replay:
            replay[0].clear_global_router_replay_action()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return after_backward

    def logprob_step():
        with torch.no_grad():
            logits = model(tokens, position_ids, mask, **fwd_kwargs)
            torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens.unsqueeze(-1))
        sync(device)
        return torch.cuda.memory_allocated() if device == "cuda" else 0

    step = train_step if mode.startswith("train") else logprob_step
    for _ in range(args["warmup"]):
        step()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, steady = [], []
    for _ in range(args["steps"]):
        sync(device)
        t0 = time.perf_counter()
        steady.append(step())
        sync(device)
        times.append(time.perf_counter() - t0)
    step_times_ms = [1000 * t for t in times]
    times.sort()
    step_s = times[len(times) // 2]  # median: robust to one slow step
    result = {
        "step_times_ms": step_times_ms,
        "step_ms_min": 1000 * times[0], "step_ms_max": 1000 * times[-1],
        "impl": args["impl"], "scenario": args["scenario"],
        "step_ms": 1000 * step_s,
        "tokens_per_s": args["batch"] * args["seq"] / step_s,
        "peak_gib": gib(torch.cuda.max_memory_allocated()) if device == "cuda" else 0.0,
        "steady_gib": gib(sum(steady) / len(steady)),
        "megatron": __import__("megatron.core", fromlist=["x"]).__file__,
        "version": __import__("megatron.core", fromlist=["x"]).__version__,
        "torch": torch.__version__, "python": sys.version.split()[0],
        "device_name": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
    }
    if mode == "logprob" and getattr(model, "mtp_process", False):
        result["mtp_share"] = mtp_share(model, step, device)
    return result


def mtp_share(model, step, device):
    """Fraction of the forward spent inside the MTP block, timed with hooks around it."""
    spent = []

    def pre(_m, _a):
        sync(device)
        spent.append(-time.perf_counter())

    def post(_m, _a, _o):
        sync(device)
        spent[-1] += time.perf_counter()

    h1 = model.mtp.register_forward_pre_hook(pre)
    h2 = model.mtp.register_forward_hook(post)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(3):
        step()
    total = time.perf_counter() - t0
    h1.remove()
    h2.remove()
    return sum(spent) / total if total else None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--impl", required=True)
    p.add_argument("--scenario", required=True)
    p.add_argument("--json-args", required=True)
    ns = p.parse_args()
    args = json.loads(ns.json_args)
    args.update(impl=ns.impl, scenario=ns.scenario)
    import_megatron_from_env()
    from bench.scenarios import SCENARIOS

    result = measure(args, SCENARIOS[ns.scenario])
    print("BENCH_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
