"""One long-lived benchmark process per configuration, driven over stdin/stdout by bench/te_bench.py.

The driver keeps every configuration of a group alive at once and lets exactly one of them run
on the GPU at a time, so A and B rounds interleave without paying a process start per round.
Noise removed at the source here:

* routing: ``--routing balanced`` forces balanced random router logits and reseeds the CUDA
  generator before every step, so every step of every process routes each token to the same
  experts (the expert loads no longer differ between configurations, processes or steps);
* tokens, seeds and initialisation are fixed; dropout is off;
* attention: Transformer Engine's cuDNN fused attention is pinned (flash and unfused off) and
  cuDNN autotuning is disabled, so every process runs the same kernels;
* timing: CUDA events around each step, after a warm-up that runs until two consecutive
  windows agree, and a few unmeasured steps at the start of every window (clocks, caches);
* host: each worker is pinned to its own CPU cores (``BENCH_CPUS``) and the garbage collector
  is off inside a measured window (step-to-step host jitter shows in a launch-bound step).

Protocol: the worker prints ``READY {json}`` once built and warm, then answers each command line
``measure N`` / ``profile N PATH`` / ``phases N [trace]`` / ``quit`` with one ``RESULT {json}`` line.
"""

import argparse
import gc
import json
import os
import statistics
import sys
import time

# Before torch starts its threads: stay on the cores the driver gave this worker, so host work
# (kernel launches, the dispatcher's device-to-host syncs) never shares a core with another
# worker's threads or migrates between windows.
if os.environ.get("BENCH_CPUS"):
    os.sched_setaffinity(0, {int(c) for c in os.environ["BENCH_CPUS"].split(",")})

import torch  # noqa: E402

from bench.impl_path import import_megatron_from_env  # noqa: E402
from bench.worker import batch, gib, setup_distributed, sync

ENV_PINS = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
}


def build_te(args, overrides, spec_kwargs=None):
    """The benchmark's GPT + MoE + MTP model with TE specs (or local specs with --spec local).

    ``spec_kwargs`` go to the layer-spec function (upstream dev's ``enable_hyper_connection=True``
    selects its HyperConnectionTransformerLayer)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.transformer import TransformerConfig

    te = args["spec"] == "te"
    cuda = args["device"] == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    values = dict(
        num_layers=args["layers"], hidden_size=args["hidden"], num_attention_heads=args["heads"],
        ffn_hidden_size=args["ffn"] or args["hidden"], num_moe_experts=args["experts"],
        moe_router_topk=args["topk"], moe_token_dispatcher_type=args["dispatcher"],
        mtp_num_layers=1, add_bias_linear=False, bf16=cuda, params_dtype=dtype,
        hidden_dropout=0.0, attention_dropout=0.0,
        use_cpu_initialization=not cuda, moe_grouped_gemm=te,
        moe_router_force_load_balancing=args["routing"] == "balanced",
    )  # fmt: skip
    if te:  # one attention kernel in every process: cuDNN fused attention (flash, unfused off)
        from megatron.core.transformer.enums import AttnBackend

        values["attention_backend"] = AttnBackend.fused
    values.update(overrides)
    config = TransformerConfig(**values)
    if te:
        spec = get_gpt_layer_with_transformer_engine_spec(
            num_experts=args["experts"], moe_grouped_gemm=True, **(spec_kwargs or {})
        )
    else:
        spec = get_gpt_layer_local_spec(num_experts=args["experts"], moe_grouped_gemm=False, **(spec_kwargs or {}))
    mtp = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=te)
    model = GPTModel(config, spec, vocab_size=args["vocab"], max_sequence_length=args["seq"], mtp_block_spec=mtp)
    return model.to(device=args["device"], dtype=dtype)


class Trainer:
    """Builds one configuration and runs its training steps."""

    def __init__(self, args, config):
        self.args = args
        self.device = args["device"]
        setup_distributed(self.device)(args["seed"])
        if config.get("stand_in") == "mhc-floor":
            from bench.experiments import mhc_floor

            mhc_floor.install()
        torch.manual_seed(args["seed"])
        torch.backends.cudnn.benchmark = False
        self.model = build_te(args, config["config"], config.get("spec"))
        self.tokens, self.position_ids, self.mask = batch(args)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-6)
        self.replay = None
        if config.get("replay"):
            from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

            self._reseed()
            RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)
            with torch.no_grad():
                self.model(self.tokens, self.position_ids, self.mask)
            recorded = RouterReplay.get_recorded_data()
            RouterReplay.clear_global_router_replay_action()
            self.replay = (RouterReplay, RouterReplayAction, recorded)

    def _reseed(self):
        # The balanced router draws its logits from the default CUDA generator: the same draw
        # every step gives the same routing every step, in every process.
        if self.args["routing"] == "balanced" and self.device == "cuda":
            torch.cuda.manual_seed(self.args["seed"])

    def forward(self):
        """A step's forward through the loss (replaying the recorded routing under R3)."""
        self._reseed()
        if self.replay:
            rr, action, recorded = self.replay
            rr.set_replay_data(recorded)
            rr.set_global_router_replay_action(action.REPLAY_FORWARD)
        return self.model(self.tokens, self.position_ids, self.mask, labels=self.tokens)

    def backward_and_update(self, loss):
        """The rest of the step; returns the bytes allocated right after backward."""
        loss.float().mean().backward()
        after_backward = torch.cuda.memory_allocated() if self.device == "cuda" else 0
        if self.replay:
            self.replay[0].clear_global_router_replay_action()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return after_backward

    def step(self):
        """One training step; returns the bytes allocated right after backward."""
        return self.backward_and_update(self.forward())

    def phases(self, n, trace=False):
        """Where a step's memory peak falls: the peak of the forward (through the loss) and of
        the rest of the step, each from its own reset of the peak counter, for ``n`` steps; with
        ``trace``, one more step under the allocator's history, and what was live at its peak
        (bench/memory_trace.py)."""
        cuda = self.device == "cuda"
        rows = []
        for _ in range(n):
            sync(self.device)
            row = {"start_gib": gib(torch.cuda.memory_allocated()) if cuda else 0.0}
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            loss = self.forward()
            sync(self.device)
            if cuda:
                row.update(forward_peak_gib=gib(torch.cuda.max_memory_allocated()),
                           after_forward_gib=gib(torch.cuda.memory_allocated()))  # fmt: skip
                torch.cuda.reset_peak_memory_stats()
            row["after_backward_gib"] = gib(self.backward_and_update(loss))
            sync(self.device)
            if cuda:
                row["backward_peak_gib"] = gib(torch.cuda.max_memory_allocated())
            rows.append(row)
        result = {"steps": rows}
        if trace and cuda:
            from bench.memory_trace import peak_of_trace

            torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python")
            try:
                self.step()
                sync(self.device)
                snapshot = torch.cuda.memory._snapshot()
            finally:
                torch.cuda.memory._record_memory_history(enabled=None)
            events = snapshot["device_traces"][torch.cuda.current_device()]
            result["trace_peak"] = peak_of_trace(events)
        return result

    def timed_steps(self, n):
        """n steps, each timed with CUDA events (host clock on CPU); milliseconds."""
        if self.device != "cuda":
            out = []
            for _ in range(n):
                t0 = time.perf_counter()
                self.step()
                out.append(1000 * (time.perf_counter() - t0))
            return out, [0]
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        steady = []
        sync(self.device)
        for start, end in events:
            start.record()
            steady.append(self.step())
            end.record()
        sync(self.device)
        return [s.elapsed_time(e) for s, e in events], steady

    def warm_up(self, window, tolerance, max_steps):
        """Run windows until two consecutive window medians agree within ``tolerance``."""
        medians, done = [], 0
        while done < max_steps:
            times, _ = self.timed_steps(window)
            done += window
            medians.append(statistics.median(times))
            if len(medians) >= 2 and abs(medians[-1] / medians[-2] - 1) <= tolerance:
                break
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        return {"warmup_steps": done, "warmup_medians_ms": medians}

    def measure(self, n, lead_in):
        self.timed_steps(lead_in)  # unmeasured: back to steady clocks after waiting
        gc.collect()
        gc.disable()  # no collector pause inside a measured window
        try:
            times, steady = self.timed_steps(n)
        finally:
            gc.enable()
        cuda = self.device == "cuda"
        return {
            "gpu_state": gpu_state() if cuda else {},
            "step_times_ms": times,
            "peak_gib": gib(torch.cuda.max_memory_allocated()) if cuda else 0.0,
            "steady_gib": gib(sum(steady) / len(steady)),
        }

    def profile(self, n, path):
        """Kernel time table (torch.profiler) and a census of what forward keeps for backward."""
        from torch.profiler import ProfilerActivity, profile

        census = saved_tensor_census(self)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
        with profile(activities=activities) as prof:
            self.timed_steps(n)
        sort = "self_cuda_time_total" if self.device == "cuda" else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort, row_limit=45, max_name_column_width=70)
        with open(path, "w") as f:
            f.write(f"# {n} steps\n\n## saved for backward, by innermost module class (MiB)\n")
            for name, mib in census:
                f.write(f"{mib:10.1f}  {name}\n")
            f.write("\n## kernels and ops by self device time\n" + table + "\n")
        return {"path": path, "saved_for_backward_mib": dict(census[:12])}


def gpu_state():
    """SM clock (MHz), power (W) and temperature (C) right after a window, where NVML answers:
    to see whether the shifts between windows follow the GPU's clocks. Empty where it does not."""
    state = {}
    for key, read in (("sm_clock_mhz", torch.cuda.clock_rate), ("power_w", torch.cuda.power_draw),
                      ("temp_c", torch.cuda.temperature)):  # fmt: skip
        try:
            value = read()
        except Exception:  # no pynvml, or NVML refused: the figures are optional
            continue
        state[key] = value / 1000 if key == "power_w" else value  # power_draw answers milliwatts
    return state


def saved_tensor_census(trainer):
    """MiB that one forward keeps for backward, by the class of the innermost module saving it."""
    from torch.autograd.graph import saved_tensors_hooks
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    stack, seen, by_class = [], set(), {}

    def pre(module, _args):
        stack.append(type(module).__name__)

    def post(module, _args, _out):
        if stack:
            stack.pop()

    def pack(t):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            try:
                key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            except (RuntimeError, NotImplementedError):
                key = (id(t), t.numel() * t.element_size())
            if key not in seen:
                seen.add(key)
                owner = stack[-1] if stack else "<top>"
                by_class[owner] = by_class.get(owner, 0) + key[1]
        return t

    h1, h2 = register_module_forward_pre_hook(pre), register_module_forward_hook(post)
    try:
        trainer._reseed()
        with saved_tensors_hooks(pack, lambda t: t):
            loss = trainer.model(trainer.tokens, trainer.position_ids, trainer.mask, labels=trainer.tokens)
        loss.float().mean().backward()
        trainer.optimizer.zero_grad(set_to_none=True)
    finally:
        h1.remove()
        h2.remove()
    return sorted(((k, v / 2**20) for k, v in by_class.items()), key=lambda kv: -kv[1])



def mhc_functions_module():
    """Which functions the fused mHC path ran: the kernels' module, a bench stand-in's, or None (a
    tree without mHC, such as pristine upstream). On the upstream-dev line the module holds only
    the kernels that dev's own mHC calls (no ``mhc_input``): then the module itself is named."""
    try:
        from megatron.core.transformer import hyper_connection_fused as fused_mhc
    except ImportError:
        return None
    entry = getattr(fused_mhc, "mhc_input", None)
    return entry.__module__ if entry is not None else fused_mhc.__name__

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True, help="configuration name in bench.te_bench.CONFIGS")
    p.add_argument("--json-args", required=True)
    ns = p.parse_args()
    args = json.loads(ns.json_args)
    for key, value in ENV_PINS.items():
        os.environ.setdefault(key, value)
    import_megatron_from_env()  # before bench.te_bench, which puts the checkout first on the path
    from bench.te_bench import CONFIGS

    trainer = Trainer(args, CONFIGS[ns.config])
    ready = trainer.warm_up(args["warmup_window"], args["warmup_tolerance"], args["warmup_max"])
    ready.update(config=ns.config, megatron=__import__("megatron.core", fromlist=["x"]).__file__,
                 version=__import__("megatron.core", fromlist=["x"]).__version__, torch=torch.__version__,
                 device_name=torch.cuda.get_device_name(0) if args["device"] == "cuda" else "cpu")  # fmt: skip
    ready["mhc_functions"] = mhc_functions_module()
    print("READY " + json.dumps(ready), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "measure":
            result = trainer.measure(int(words[1]), args["lead_in"])
        elif words[0] == "profile":
            result = trainer.profile(int(words[1]), words[2])
        elif words[0] == "phases":
            result = trainer.phases(int(words[1]), trace=words[2:] == ["trace"])
        else:
            result = {"error": f"unknown command {line.strip()!r}"}
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
