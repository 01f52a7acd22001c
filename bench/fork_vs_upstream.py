"""Benchmark: the fork against the pinned, unpatched upstream, and the cost of fork features (not a test).

Trains a GPT + MoE + MTP model (local specs, bf16) in fresh processes, one per measurement, and
compares implementations side by side (bench/scenarios.py, COMPARISONS): upstream vs fork with
features off, R3 replay off vs on, no mHC vs mHC at 4 streams (without and with full recompute).

Each comparison runs ``--rounds`` rounds. With two GPUs, A and B run at the same time, one per
GPU, and swap GPUs every round, so both see the same machine state and neither owns the faster
GPU; with one device they alternate (A first in even rounds, B first in odd ones). Every process
measures ``--steps`` steps after ``--warmup``; each round gives one B/A ratio of the median step
times and of the peak memory. Rows print the median and the min-max over rounds.

    python bench/fork_vs_upstream.py --json bench.json          # defaults: batch 2, seq 4096, alltoall
    python bench/fork_vs_upstream.py --from-json bench.json --write-docs   # re-render, update docs
    python bench/fork_vs_upstream.py --device cpu --layers 2 --hidden 64 --seq 64 --batch 1 \\
        --steps 2 --warmup 1 --rounds 1 --only mhc-overhead            # smoke run
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.docs_text import mhc_overhead_line, put_between_markers  # noqa: E402
from bench.impl_path import ENV as IMPL_ENV  # noqa: E402
from bench.scenarios import COMPARISONS  # noqa: E402

DOCS = ROOT / "docs" / "performance.md"
MHC_LINE = re.compile(r"^mHC overhead \(4 streams\): .*$", re.M)


def upstream_tree(tmp: Path) -> Path:
    """Extract the pinned upstream sdist (verified by sha256) and return its source root."""
    from tools.rebase.git.paths import Layout
    from tools.rebase.stack.pin import load_pin
    from tools.rebase.stack.source import fetch_verified_sdist

    layout = Layout(ROOT)
    archive = fetch_verified_sdist(layout.cache, load_pin(layout.pin))
    with tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
    (top,) = [p for p in tmp.iterdir() if p.is_dir()]
    return top


def start_worker(impl_root: Path, impl: str, scenario: str, args, gpu=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(impl_root), str(ROOT)])
    env[IMPL_ENV] = str(impl_root)  # the worker imports megatron from there (bench/impl_path.py)
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        env["MASTER_PORT"] = str(29500 + 17 * (gpu + 1) + os.getpid() % 500)
    cmd = [sys.executable, "-m", "bench.worker", "--impl", impl, "--scenario", scenario,
           "--json-args", json.dumps(vars(args))]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def collect(proc, impl, scenario) -> dict:
    out, err = proc.communicate()
    lines = [l for l in out.splitlines() if l.startswith("BENCH_RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"impl": impl, "scenario": scenario, "error": (err or out)[-3000:]}
    return json.loads(lines[-1][len("BENCH_RESULT "):])


def gpu_count(device) -> int:
    if device != "cuda":
        return 0
    import torch

    return torch.cuda.device_count()


def run_comparison(name, spec, args, upstream, started):
    """All rounds of one comparison: a list of {"a": result, "b": result, "gpus": ...}."""
    sides = {"a": spec["a"], "b": spec["b"]}
    rounds = []
    concurrent = gpu_count(args.device) >= 2
    for r in range(args.rounds):
        results = {}
        if concurrent:  # A and B at the same time, GPUs swapped every round
            gpus = {"a": r % 2, "b": 1 - r % 2}
            procs = {
                side: start_worker(upstream if impl == "upstream" else ROOT, impl, scen, args, gpus[side])
                for side, (scen, impl) in sides.items()
            }
            for side, (scen, impl) in sides.items():
                results[side] = collect(procs[side], impl, scen)
        else:  # one device: alternate the order
            gpus = {"a": None, "b": None}
            order = ["a", "b"] if r % 2 == 0 else ["b", "a"]
            for side in order:
                scen, impl = sides[side]
                proc = start_worker(upstream if impl == "upstream" else ROOT, impl, scen, args)
                results[side] = collect(proc, impl, scen)
        results["gpus"] = gpus
        rounds.append(results)
        status = " ".join(
            f"{side}={'error' if 'error' in results[side] else format(results[side]['step_ms'], '.1f') + 'ms'}"
            for side in ("a", "b")
        )
        print(f"[{time.time() - started:6.1f}s] {name} round {r + 1}/{args.rounds}: {status}", flush=True)
    return rounds


def summarize(name, spec, rounds):
    """Median and min-max over rounds for each side and for the B/A ratios."""
    good = [r for r in rounds if "error" not in r["a"] and "error" not in r["b"]]
    row = {"comparison": name, "a": "/".join(spec["a"][::-1]), "b": "/".join(spec["b"][::-1]),
           "rounds": len(rounds), "ok_rounds": len(good), "what": spec["what"]}  # fmt: skip
    if not good:
        errors = [r[s]["error"] for r in rounds for s in ("a", "b") if "error" in r[s]]
        row["error"] = errors[0].strip().splitlines()[-1][:200] if errors else "no rounds"
        return row

    def stats(values):
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    for side in ("a", "b"):
        row[f"{side}_step_ms"] = stats([r[side]["step_ms"] for r in good])
        row[f"{side}_peak_gib"] = stats([r[side]["peak_gib"] for r in good])
    row["step_ratio"] = stats([r["b"]["step_ms"] / r["a"]["step_ms"] for r in good])
    if all(r["a"]["peak_gib"] for r in good):
        row["peak_ratio"] = stats([r["b"]["peak_gib"] / r["a"]["peak_gib"] for r in good])
    verdicts = []
    for key, bound in spec["targets"].items():
        ratio = row.get(f"{key}_ratio")
        if ratio is not None:
            verdicts.append(ratio["median"] <= bound)
    row["pass"] = all(verdicts) and len(verdicts) == len(spec["targets"])
    return row


def fmt_stats(s, spec):
    return "-" if s is None else f"{format(s['median'], spec)} ({format(s['min'], spec)}-{format(s['max'], spec)})"


def table(rows) -> str:
    head = (f"{'comparison':28} {'A':22} {'B':24} {'A step ms':>22} {'B step ms':>22} "
            f"{'B/A step':>22} {'B/A peak':>22}")  # fmt: skip
    out = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            out.append(f"{r['comparison']:28} {r['a']:22} {r['b']:24} ERROR: {r['error']}")
            continue
        out.append(
            f"{r['comparison']:28} {r['a']:22} {r['b']:24} {fmt_stats(r['a_step_ms'], '.1f'):>22} "
            f"{fmt_stats(r['b_step_ms'], '.1f'):>22} {fmt_stats(r['step_ratio'], '.4f'):>22} "
            f"{fmt_stats(r.get('peak_ratio'), '.4f'):>22}"
        )
    out.append("")
    out.append(f"{'peak GiB (median)':28} " + "  ".join(
        f"{r['comparison']}: {r['a_peak_gib']['median']:.2f} -> {r['b_peak_gib']['median']:.2f}"
        for r in rows if "error" not in r
    ))  # fmt: skip
    return "\n".join(out)


def verdict_lines(rows):
    lines = []
    for r in rows:
        if "error" in r:
            lines.append(f"FAIL  {r['comparison']}: {r['error']}")
            continue
        figures = f"step {fmt_stats(r['step_ratio'], '.4f')}"
        if "peak_ratio" in r:
            figures += f", peak {fmt_stats(r['peak_ratio'], '.4f')}"
        lines.append(f"{'PASS' if r['pass'] else 'FAIL'}  {r['comparison']}: B/A {figures}; target {r['what']}")
    return lines


def mhc_line(rows):
    by = {r["comparison"]: r for r in rows if "error" not in r}
    m = by.get("mhc-overhead")
    if not m or "peak_ratio" not in m:
        return None
    rc = by.get("mhc-overhead-full-recompute")
    pair = (rc["step_ratio"]["median"], rc["peak_ratio"]["median"]) if rc and "peak_ratio" in rc else None
    return mhc_overhead_line("mHC overhead", m["step_ratio"]["median"], m["peak_ratio"]["median"], pair)


def write_docs(payload):
    """Put the mHC overhead line and the latest table into docs/performance.md."""
    text = DOCS.read_text()
    line = mhc_line(payload["rows"])
    if line is None:
        raise SystemExit("write-docs: no mhc-overhead result to write")
    text = MHC_LINE.sub(line, text, count=1) if MHC_LINE.search(text) else text.replace("\n## ", f"\n{line}\n\n## ", 1)
    block = "\n".join([table(payload["rows"]), "", *payload["targets"]])
    marker_a, marker_b = "<!-- bench:latest:begin -->", "<!-- bench:latest:end -->"
    meta = payload["meta"]
    wall = f"{meta['wall_s']} s wall" if isinstance(meta["wall_s"], (int, float)) else meta["wall_s"]
    body = (f"{marker_a}\n{meta.get('device_name', '?')} x{meta.get('gpus', '?')}, torch {meta.get('torch', '?')}, "
            f"{meta['args']['rounds']} rounds x {meta['args']['steps']} steps, batch {meta['args']['batch']}, "
            f"seq {meta['args']['seq']}, {meta['args']['dispatcher']} dispatcher, {wall}\n\n"
            f"```\n{block}\n```\n{marker_b}")  # fmt: skip
    text = put_between_markers(text, marker_a, marker_b, body,
                               lambda t: t.replace("\n## ", f"\n{body}\n\n## ", 1))
    DOCS.write_text(text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--ffn", type=int, default=0, help="expert FFN hidden size (default: hidden)")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--dispatcher", default="alltoall", choices=["alltoall", "allgather"])
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--rounds", type=int, default=4, help="rounds per comparison (GPUs swap each round)")
    p.add_argument("--only", nargs="*", choices=sorted(COMPARISONS), help="comparisons to run (default: all)")
    p.add_argument("--json", dest="json_out", help="write the results here as JSON")
    p.add_argument("--from-json", help="do not run: re-render the results of an earlier --json")
    p.add_argument("--write-docs", action="store_true", help="write the mHC line and table into docs/performance.md")
    args = p.parse_args(argv)
    if args.from_json:
        payload = json.loads(Path(args.from_json).read_text())
    else:
        started = time.time()
        rows, raw = [], {}
        with tempfile.TemporaryDirectory() as tmp:
            needs_upstream = any(
                "upstream" in (COMPARISONS[n]["a"][1], COMPARISONS[n]["b"][1])
                for n in COMPARISONS if not args.only or n in args.only
            )  # fmt: skip
            upstream = upstream_tree(Path(tmp)) if needs_upstream else None
            for name, spec in COMPARISONS.items():
                if args.only and name not in args.only:
                    continue
                raw[name] = run_comparison(name, spec, args, upstream, started)
                rows.append(summarize(name, spec, raw[name]))
                print("ROW " + json.dumps({"row": rows[-1], "raw": raw[name]}), flush=True)
        meta = {"args": {k: v for k, v in vars(args).items() if k not in ("from_json", "write_docs")},
                "wall_s": round(time.time() - started, 1), "gpus": gpu_count(args.device)}  # fmt: skip
        first = next((r[s] for rr in raw.values() for r in rr for s in ("a", "b") if "error" not in r[s]), {})
        meta.update({k: first.get(k) for k in ("device_name", "torch", "python")})
        payload = {"meta": meta, "rows": rows, "targets": verdict_lines(rows), "raw": raw}
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    print()
    print(table(payload["rows"]))
    print()
    for line in payload["targets"]:
        print(line)
    line = mhc_line(payload["rows"])
    if line:
        print(line)
    if args.write_docs:
        write_docs(payload)
    return 0 if all("error" not in r for r in payload["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
