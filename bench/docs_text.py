"""The text both benchmark drivers put into docs/performance.md: the mHC overhead line, and a block
between two markers that a later run replaces in place."""

import re


def mhc_overhead_line(label: str, step: float, peak: float, full_recompute=None) -> str:
    """``LABEL (4 streams): step Sx, peak Px``, with the ``(step, peak)`` pair measured under full
    recompute appended when there is one."""
    line = f"{label} (4 streams): step {step:.2f}x, peak {peak:.2f}x"
    if full_recompute is not None:
        line += f" (full recompute: step {full_recompute[0]:.2f}x, peak {full_recompute[1]:.2f}x)"
    return line


def put_between_markers(text: str, begin: str, end: str, body: str, place_new) -> str:
    """``text`` with the block from ``begin`` to ``end`` replaced by ``body`` (which carries both
    markers); where there is none yet, ``place_new(text)`` puts the first one in."""
    if begin in text:
        return re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: body, text, flags=re.S)
    return place_new(text)
