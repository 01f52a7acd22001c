"""Which megatron a benchmark worker imports: the one of the implementation it measures.

Why: workers start as ``python -m bench.<worker>`` from the checkout's root, so the checkout's own
``megatron/`` (the fork) sits first on ``sys.path``; a PYTHONPATH entry for the upstream tree came
after it, and every "upstream" worker before this module measured the fork (their ready records
named the fork's ``megatron/core``). The driver now names the tree in ``BENCH_IMPL_ROOT`` and the
worker imports from it or stops.
"""

import os
import sys
from pathlib import Path

ENV = "BENCH_IMPL_ROOT"


def import_megatron_from(root):
    """Import ``megatron.core`` from the source root ``root`` (holding ``megatron/core``), or exit
    naming where it came from instead. Call before anything imports megatron."""
    root = Path(root).resolve()
    if not (root / "megatron" / "core" / "__init__.py").is_file():
        raise SystemExit(f"{ENV}={root}: no megatron/core/__init__.py there")
    if "megatron.core" not in sys.modules:
        sys.path.insert(0, str(root))
    import megatron.core

    got = Path(megatron.core.__file__).resolve()
    if root not in got.parents:
        raise SystemExit(f"benchmark worker for {root} imported megatron.core from {got}")
    return megatron.core


def import_megatron_from_env():
    """:func:`import_megatron_from` of ``$BENCH_IMPL_ROOT`` when the driver set it."""
    root = os.environ.get(ENV)
    return import_megatron_from(root) if root else None
