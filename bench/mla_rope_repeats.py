"""Repeat the MLA layer's fused-vs-unfused YaRN RoPE comparison and say where the runs differ
(not a test).

``tests/unit_tests/fusions/test_fused_mla_yarn_rope_apply.py::TestMLAYarnRopeKernelsGPU::
test_fused_vs_unfused_mla_forward_backward`` asserts the two paths agree; run here --repeats times
per layer spec, each comparison it makes is recorded instead of asserted: the largest difference,
the largest value compared, and for a tensor outside the test's tolerance how many elements and
which rows. Used to tell an intermittent kernel result from a tolerance set too tight.

    python bench/mla_rope_repeats.py --heads 24 --k-dim 128 --repeats 8 [--retune]   # from the line's tree
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heads", type=int, default=24)
    p.add_argument("--k-dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=8, help="runs per layer spec")
    p.add_argument("--specs", nargs="+", default=["transformer_engine", "local"])
    p.add_argument("--retune", action="store_true",
                   help="empty the RoPE kernels' autotuner caches before each run, so every run times "
                        "the BLOCK_H configs again (the suite's workers each tune once, under load)")  # fmt: skip
    args = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        sys.exit("needs a CUDA device (the MLA layer test runs on CUDA)")
    from tests.unit_tests.fusions import test_fused_mla_yarn_rope_apply as mla_test

    seen = []

    def record(actual, expected, rtol=0.0, atol=0.0, msg=None, **_):
        diff = (actual.double() - expected.double()).abs()
        bad = diff > atol + rtol * expected.double().abs()
        name = msg(" ").split(":")[0].strip() if callable(msg) else "output or input gradient"
        line = f"  {name[:40]}: max diff {diff.max().item():.3g}, max |value| {expected.abs().max().item():.3g}"
        if bad.any():
            rows = sorted(set(bad.nonzero()[:, 0].tolist()))
            line += f"; {int(bad.sum())} elements outside the test's tolerance, rows {rows[:12]}"
        seen.append((bool(bad.any()), line))

    torch.testing.assert_close = record  # this process only: the comparisons are reported
    case = mla_test.TestMLAYarnRopeKernelsGPU()
    for spec in args.specs:
        for i in range(args.repeats):
            seen.clear()
            if args.retune:
                for role in mla_test.KERNEL_NAMES:
                    getattr(mla_test._kernel(mla_test.fused_rope, role), "cache", {}).clear()
            case.test_fused_vs_unfused_mla_forward_backward(args.heads, args.k_dim, spec)
            outside = [line for bad, line in seen if bad]
            print(f"{spec} run {i}: {len(outside)} of {len(seen)} compared tensors outside the test's tolerance; "
                  f"autotuned BLOCK_H {mla_test._autotuned_block_h()}")  # fmt: skip
            for line in outside or [line for _, line in seen[:3]]:
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
