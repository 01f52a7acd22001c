"""Where each configuration's step peaks: in the forward (through the loss) or in the backward,
and what is live then.

Why: te_bench.py reports one peak per configuration. When two trees peak equally (the fork and
upstream under full recompute at hidden 2048, while at hidden 4096 the fork is 12% lower) the
question is whether the peak falls before the tensors a patch frees would have piled up. Peak
memory does not vary between runs, so each configuration runs alone, one worker after another,
with no rounds.

    python3 bench/te_peak_phases.py --upstream .upstream/megatron_core-0.19.2 --batch 4 \\
        --configs upstream/rc fork/rc --trace --json phases.json
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.te_bench import CONFIGS, Worker, add_model_arguments, fork_root, upstream_root  # noqa: E402


def run(args):
    """Each configuration's phase peaks (and, with --trace, its peak's live sites), in order."""
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"--configs: unknown configuration(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    if args.trace and args.device != "cuda":
        raise SystemExit("--trace needs --device cuda: the allocator history it reads is CUDA's")
    upstream = upstream_root(args, args.configs)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="te-phases-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    worker_args = {k: v for k, v in vars(args).items() if k not in ("configs", "trace", "json_out", "log_dir")}
    # Warm-up only until the first window: memory, not time, is measured here.
    worker_args.update(warmup_window=1, warmup_tolerance=1.0, warmup_max=2, lead_in=0, steps=1)
    out = {}
    for name in args.configs:
        root = upstream if CONFIGS[name]["impl"] == "upstream" else fork_root(args)
        worker = Worker(name, worker_args, root, None, log_dir)
        try:
            ready = worker.wait_ready()
            result = worker.request(f"phases {args.phase_steps}" + (" trace" if args.trace else ""))
        finally:
            worker.close()
        result["megatron"] = ready.get("megatron")
        out[name] = result
        print(line(name, result), flush=True)
        for site, gib in result.get("trace_peak", {}).get("live_at_peak_by_site_gib", []):
            print(f"    {gib:8.3f} GiB  {site}")
    return out


def line(name, result):
    last = result["steps"][-1]
    fwd, bwd = last.get("forward_peak_gib", 0.0), last.get("backward_peak_gib", 0.0)
    where = "forward" if fwd > bwd else "backward" if bwd > fwd else "both"
    text = (f"{name:16s} forward peak {fwd:7.2f} GiB  backward peak {bwd:7.2f} GiB  after forward "
            f"{last.get('after_forward_gib', 0.0):7.2f} GiB  -> peak in {where}")
    trace = result.get("trace_peak")
    if trace:
        text += (f"; traced peak at {100 * trace['peak_fraction']:.0f}% of the step's allocator events, "
                 f"reached by {trace['allocation_at_peak']}")
    return text


def main(argv=None):
    p = add_model_arguments(argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    p.add_argument("--configs", nargs="+", required=True, help="configuration names of bench/te_bench.py")
    p.add_argument("--phase-steps", type=int, default=2, help="steps measured by phase (the last one is printed)")
    p.add_argument("--trace", action="store_true", help="also one step under the allocator's history")
    p.add_argument("--log-dir")
    p.add_argument("--json", dest="json_out")
    args = p.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    out = run(args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"args": vars(args), "configs": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
