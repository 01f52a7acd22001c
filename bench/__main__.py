"""The one entry point of the maintained benchmarks: ``python -m bench`` lists them,
``python -m bench NAME [ARGS...]`` runs one (as ``python bench/NAME.py ARGS...`` would).

Why: bench/ also holds helpers that are not entry points (workers, shared text, scenarios) and
decided experiments live in bench/experiments/; this list says which scripts are maintained.
Every script of bench/ must be listed here or in HELPERS (tests/bench/test_entry_point.py).
"""

import runpy
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (file, where it runs, what it measures)
BENCHMARKS = {
    "te_bench": ("te_bench.py", "GPU", "TE specs: fork vs pinned upstream and each feature's cost, 95% intervals"),
    "te_peak_phases": ("te_peak_phases.py", "GPU", "where a step's memory peaks (forward or backward) and what is live"),
    "fork_vs_upstream": ("fork_vs_upstream.py", "GPU", "local specs: fork vs upstream and feature costs, GPUs swapped per round"),
    "mhc_kernels": ("mhc_kernels.py", "GPU", "one mHC sublayer: native functions vs the fused Triton kernels"),
    "dev_mhc_ops": ("dev_mhc_ops.py", "GPU", "upstream dev's native-fallback mHC ops vs the fork's Triton kernels (upstream-dev line)"),
    "mla_rope_repeats": ("mla_rope_repeats.py", "GPU", "the MLA layer's fused-vs-unfused RoPE comparison repeated: where runs differ"),
    "proj_block_sweep": ("proj_block_sweep.py", "GPU", "backward schedule and tile shapes of the upstream-dev line's projection kernels, the fastest"),
    "triton_resources": ("triton_resources.py", "CPU", "registers, spills and MMA kinds of the upstream-dev line's projection kernels, compiled for sm_90 without a GPU"),
    "mhc_convert_crosscheck": ("mhc_convert_crosscheck.py", "CPU", "the converter test's float64 reference against the release line's model, across the two trees"),
    "rl_logprob_gap": ("rl_logprob_gap.py", "CPU/GPU", "bf16 training log-probs vs a float64 reference, per RL precision option"),
    "report_corpus": ("report_corpus.py", "CPU", "report accuracy on Megatron-LM's own cherry-picks (needs a mirror)"),
    "suite_counts": ("suite_counts.py", "CPU", "the test counts the README states, by pytest's own collection"),
    "int4_kernel": ("int4_kernel.py", "GPU", "INT4 fake-QAT quantize-dequantize: torch reference vs the fused kernel"),
    "te_gpu_batch": ("te_gpu_batch.sh", "GPU host", "batches for a GPU host: TE tests, GPU suite, benches, mutants"),
    "line_trees": ("line_trees.sh", "CPU", "the trees a GPU run of a line carries (needs a Megatron-LM mirror)"),
    "dev_line_gpu": ("dev_line_gpu.sh", "GPU host", "the upstream-dev line against pristine dev: dev's tests, the suite, the mHC bench"),
    "junit_compare": ("junit_compare.py", "CPU", "compare two junit-xml runs (fork vs upstream verdicts per test)"),
    "hand_mutants": ("hand_mutants.py", "CPU", "hand-written mutants of patches against their Tests: (killed / survived / equivalent)"),
    "rebase_bench": ("rebase_bench.py", "CPU", "bump vs raw git rebase + range-diff (target <= 1.5x)"),
    "bump_rehearsal": ("bump_rehearsal.py", "CPU", "bump a line onto upstream states built from a mirror (PRs merged onto its pin, a sync): stops, lent versions, tests"),
    "gate_bench": ("gate_bench.py", "CPU", "a bump's finishing gate (every patch's Tests: on the whole stack): cold, then reused"),
    "report_bench": ("report_bench.py", "CPU", "report on a 25-patch stack across 1,200 upstream commits (target <= 2 s)"),
    "sdist_download_bench": ("sdist_download_bench.py", "CPU", "cold, hash-checked download of the pinned sdist (target < 15 s)"),
}

# Modules the benchmarks import or start; not run on their own.
HELPERS = {"__init__.py", "__main__.py", "docs_text.py", "impl_path.py", "memory_trace.py", "scenarios.py",
           "te_worker.py", "worker.py"}


def listing() -> str:
    width = max(map(len, BENCHMARKS))
    rows = [f"  {name:<{width}}  {where:<8}  {what}" for name, (_, where, what) in BENCHMARKS.items()]
    return ("usage: python -m bench NAME [ARGS...]   (NAME --help for its options; bench/README.md)\n\n"
            "maintained benchmarks:\n" + "\n".join(rows) + "\n\ndecided experiments: bench/experiments/README.md")


def main(argv) -> int:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
        return 0
    name, args = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"python -m bench: no benchmark named {name!r}\n\n{listing()}", file=sys.stderr)
        return 2
    path = HERE / BENCHMARKS[name][0]
    if path.suffix == ".sh":
        return subprocess.call(["bash", str(path), *args])
    sys.argv = [str(path), *args]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
