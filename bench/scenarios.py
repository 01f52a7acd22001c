"""What each benchmark row runs, and the targets it is judged against (pass/fail lines)."""

RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}

# Fork-only knobs, by the names the patches give them.
RECLAIM = {"recompute_reclaim_inputs": True}
MHC = {"enable_mhc_connections": True, "mhc_num_residual_streams": 4}
MTP_FREE_FORWARD = {"compute_mtp": False}

SCENARIOS = {
    "plain": {"impls": ["upstream", "fork"], "config": {}, "mode": "train"},
    "full-recompute": {"impls": ["upstream", "fork"], "config": RECOMPUTE, "mode": "train"},
    "full-recompute+reclaim": {"impls": ["fork"], "config": {**RECOMPUTE, **RECLAIM}, "mode": "train"},
    "logprob-forward-with-mtp": {"impls": ["fork"], "config": {}, "mode": "logprob"},
    "logprob-forward-mtp-free": {"impls": ["fork"], "config": {}, "mode": "logprob", "forward": MTP_FREE_FORWARD},
    "mhc+mtp": {"impls": ["fork"], "config": MHC, "mode": "train"},
    "mhc+full-recompute": {"impls": ["fork"], "config": {**RECOMPUTE, **MHC}, "mode": "train"},
    "r3-replay-off": {"impls": ["fork"], "config": {}, "mode": "train"},
    "r3-replay-on": {"impls": ["fork"], "config": {"moe_enable_routing_replay": True}, "mode": "train-replay"},
}


def _get(by_key, scenario, impl):
    row = by_key.get((scenario, impl))
    return None if row is None or "error" in row else row


def _verdict(ok, text):
    return f"{'PASS' if ok else 'FAIL'}  {text}"


def parity(by_key):
    lines = []
    for scenario in ("plain", "full-recompute"):
        fork, up = _get(by_key, scenario, "fork"), _get(by_key, scenario, "upstream")
        if not fork or not up:
            lines.append(_verdict(False, f"parity [{scenario}]: missing result"))
            continue
        speed = fork["tokens_per_s"] / up["tokens_per_s"]
        peak = fork["peak_gib"] / up["peak_gib"] if up["peak_gib"] else 1.0  # no peak on CPU
        ok = speed >= 0.99 and peak <= 1.01
        lines.append(_verdict(ok, f"parity [{scenario}]: fork/upstream tokens/s {speed:.4f} (>= 0.99), peak memory {peak:.4f} (<= 1.01)"))
    return "\n".join(lines)


def reclaim(by_key):
    off, on = _get(by_key, "full-recompute", "fork"), _get(by_key, "full-recompute+reclaim", "fork")
    if not off or not on:
        return _verdict(False, "reclaim: missing result")
    saved = off["steady_gib"] - on["steady_gib"]
    pct = 100.0 * saved / off["steady_gib"] if off["steady_gib"] else 0.0
    return _verdict(saved > 0.01, f"reclaim: steady-state memory after backward {off['steady_gib']:.2f} -> {on['steady_gib']:.2f} GiB (saves {saved:.2f} GiB, {pct:.1f}%); peak {off['peak_gib']:.2f} -> {on['peak_gib']:.2f} GiB")


def mtp_free(by_key):
    with_mtp, free = _get(by_key, "logprob-forward-with-mtp", "fork"), _get(by_key, "logprob-forward-mtp-free", "fork")
    if not with_mtp or not free:
        return _verdict(False, "MTP-free forward: missing result")
    share = with_mtp.get("mtp_share")
    speedup = 1.0 - free["step_ms"] / with_mtp["step_ms"]
    lighter = free["peak_gib"] < with_mtp["peak_gib"]
    ok = lighter and share is not None and speedup >= 0.9 * share
    return _verdict(ok, f"MTP-free forward: {with_mtp['step_ms']:.1f} -> {free['step_ms']:.1f} ms ({100 * speedup:.1f}% faster; MTP block share of the forward {100 * (share or 0):.1f}%), peak {with_mtp['peak_gib']:.2f} -> {free['peak_gib']:.2f} GiB")


def r3_cost(by_key):
    off, on = _get(by_key, "r3-replay-off", "fork"), _get(by_key, "r3-replay-on", "fork")
    if not off or not on:
        return _verdict(False, "R3 replay cost: missing result")
    cost = on["step_ms"] / off["step_ms"] - 1.0
    return _verdict(cost < 0.02, f"R3 replay cost: step {off['step_ms']:.1f} -> {on['step_ms']:.1f} ms ({100 * cost:+.2f}%, target < 2%)")


TARGETS = [parity, reclaim, mtp_free, r3_cost]

# Side-by-side comparisons: A and B run at the same time (one per GPU, swapped every round) or
# alternate on one device; each round gives one B/A ratio. ``targets`` bound the median ratios:
# "step" is B's step time over A's, "peak" B's peak memory over A's.
COMPARISONS = {
    "mhc-overhead": {
        "a": ("plain", "fork"), "b": ("mhc+mtp", "fork"),
        "targets": {"step": 1.10, "peak": 1.20}, "what": "mHC 4 streams vs none: step <= 1.10x, peak <= 1.20x",
    },
    "mhc-overhead-full-recompute": {
        "a": ("full-recompute", "fork"), "b": ("mhc+full-recompute", "fork"),
        "targets": {"peak": 1.10}, "what": "mHC 4 streams vs none, full recompute: peak <= 1.10x",
    },
    "fork-vs-upstream": {
        "a": ("plain", "upstream"), "b": ("plain", "fork"),
        "targets": {"step": 1 / 0.99, "peak": 1.01},
        "what": "features off: fork/upstream tokens/s >= 0.99 (step ratio <= 1.0101), peak <= 1.01",
    },
    "r3-replay-cost": {
        "a": ("r3-replay-off", "fork"), "b": ("r3-replay-on", "fork"),
        "targets": {"step": 1.02}, "what": "R3 replay cost < 2%",
    },
}
