"""What is live at the peak of a CUDA allocator history (``torch.cuda.memory._snapshot()``).

Why: two trees can end a step with the same peak for different reasons; the peak counter says how
high, not when or what. The allocator's history ("device_traces": alloc and free events with the
Python stack of each allocation, innermost frame first) answers both: replay it, find the event at
which the allocated bytes were highest, and group what was live then by the innermost frame of
megatron that allocated it.
"""

from collections import defaultdict

GIB = 2**30


def site_of(frames, marker="/megatron/"):
    """``file:line function`` of the innermost frame under ``marker``, else of the innermost
    frame; "no Python frame" for an allocation made outside Python (the autograd engine)."""
    if not frames:
        return "no Python frame"
    frame = next((f for f in frames if marker in f.get("filename", "")), frames[0])
    name = frame.get("filename", "?")
    if marker in name:
        name = name[name.rindex(marker) + 1:]
    return f"{name}:{frame.get('line', '?')} {frame.get('name', '?')}"


def _replay(events, stop=None):
    """Bytes allocated after each event (relative to the start of the history) and, when replayed
    up to ``stop``, the blocks live just after that event."""
    live, total, totals = {}, 0, []
    for i, ev in enumerate(events):
        action, addr, size = ev.get("action"), ev.get("addr"), ev.get("size", 0)
        if action == "alloc":
            live[addr] = ev
            total += size
        elif action in ("free_requested", "free_completed"):
            # A deferred free shows both events; the bytes leave the count at the first one.
            # A block allocated before the history began is not in ``live`` and counts once too.
            if addr in live:
                total -= live.pop(addr).get("size", 0)
            elif action == "free_requested":
                total -= size
        totals.append(total)
        if stop is not None and i == stop:
            return totals, live
    return totals, live


def peak_of_trace(events, top=10):
    """Where the history's allocated bytes peak, what allocation reached it, and the live bytes
    at that moment by allocating site (largest first, ``top`` of them)."""
    if not events:
        raise ValueError("memory trace: no events (was the allocator history recording?)")
    totals, _ = _replay(events)
    peak = max(range(len(totals)), key=totals.__getitem__)
    _, live = _replay(events, stop=peak)
    by_site = defaultdict(int)
    for ev in live.values():
        by_site[site_of(ev.get("frames", []))] += ev.get("size", 0)
    ranked = sorted(by_site.items(), key=lambda kv: -kv[1])[:top]
    return {
        "events": len(events),
        "peak_event": peak,
        "peak_fraction": round(peak / max(len(events) - 1, 1), 4),
        "peak_above_start_gib": round(totals[peak] / GIB, 4),
        "allocation_at_peak": site_of(events[peak].get("frames", [])),
        "live_at_peak_by_site_gib": [[site, round(b / GIB, 4)] for site, b in ranked],
    }
