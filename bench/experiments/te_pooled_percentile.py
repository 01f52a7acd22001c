"""Analysis (not a test): the B/A ratio of a low percentile of all steps of each side, pooled over
the rounds of a ``bench/te_bench.py`` JSON, with a bootstrap interval over rounds.

Why: the window medians of a TE run shift by ~5% while the fastest step of each side stays put
(docs/performance.md, "Fork against upstream"); this asks whether a floor-like estimator resolves the
fork's cost better than the t-interval of per-round median ratios the bench prints.

    python3 bench/experiments/te_pooled_percentile.py bench/results/2026-12-02-h200-te-fork-vs-upstream-short-windows.json
"""

import argparse
import json
import math
import random


def percentile(values, q):
    v = sorted(values)
    k = (len(v) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def pooled_ratio(a_windows, b_windows, q, rounds):
    """B/A of the q-th percentile of the steps of the given rounds (each side pooled)."""
    a = [t for r in rounds for t in a_windows[r]]
    b = [t for r in rounds for t in b_windows[r]]
    return percentile(b, q) / percentile(a, q)


def bootstrap(a_windows, b_windows, q, samples=2000, seed=0):
    """(ratio, low, high): the pooled ratio and a 95% percentile-bootstrap interval over rounds."""
    n = len(a_windows)
    rng = random.Random(seed)
    draws = sorted(pooled_ratio(a_windows, b_windows, q, [rng.randrange(n) for _ in range(n)])
                   for _ in range(samples))  # fmt: skip
    return pooled_ratio(a_windows, b_windows, q, range(n)), draws[int(0.025 * samples)], draws[int(0.975 * samples) - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("json", nargs="+")
    ap.add_argument("--a", default="upstream")
    ap.add_argument("--b", default="fork")
    ap.add_argument("--gpu", default="0")
    args = ap.parse_args()
    for path in args.json:
        windows = json.load(open(path))["windows"][args.gpu]
        a = [w["step_times_ms"] for w in windows[args.a]]
        b = [w["step_times_ms"] for w in windows[args.b]]
        for q in (0.05, 0.10, 0.25, 0.50):
            r, lo, hi = bootstrap(a, b, q)
            print(f"{path}: {args.b}/{args.a} step, pooled p{round(q * 100):02d}: {r:.4f} [{lo:.4f}, {hi:.4f}]")


if __name__ == "__main__":
    main()
