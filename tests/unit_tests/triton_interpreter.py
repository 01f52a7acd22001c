"""Run a test class of Triton kernels under Triton's CPU interpreter, in a fresh process.

``TRITON_INTERPRET=1`` only takes effect if it is set before triton decorates the kernels, i.e.
before the kernel modules are imported, so interpreter cases cannot share the test session's
process. Mark such a class ``@pytest.mark.triton_interpreter_child`` (tests/conftest.py deselects
it in any process without the interpreter) and have one parent test call
:func:`assert_interpreter_suite_passes` on it.
"""

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
MIN_INTERPRETER_VERSION = (3, 9)


def interpreter_unusable_reason() -> Optional[str]:
    """Why Triton's interpreter cannot run the suites here, or None when it can.

    Interpreters older than 3.9 (seen: 3.6) fail on loops bounded by scalar arguments.
    """
    try:
        import triton
    except ImportError:
        return "triton is not installed"
    version = tuple(int(part) for part in triton.__version__.split(".")[:2])
    if version < MIN_INTERPRETER_VERSION:
        return (
            f"the interpreter of triton {triton.__version__} (older than 3.9) fails on loops "
            "bounded by scalar arguments"
        )
    return None


# For the parent test of an interpreter suite: not in the child, and only where it can run.
_SKIP_PARENT_REASON = "this is the interpreter child" if INTERPRETING else interpreter_unusable_reason()
interpreter_parent = pytest.mark.skipif(_SKIP_PARENT_REASON is not None, reason=str(_SKIP_PARENT_REASON))


def assert_interpreter_suite_passes(test_file: str, class_name: str, timeout: int = 1800) -> None:
    """Run ``test_file::class_name`` with ``TRITON_INTERPRET=1`` and no GPU; fail on anything but
    every case passing (a skipped or deselected case means the interpreter run proved nothing)."""
    target = f"{Path(test_file).resolve()}::{class_name}"
    # The child starts its own process group: the parent's rendezvous variables name a port the
    # parent's store already listens on.
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    child = subprocess.run(
        [sys.executable, "-m", "pytest", target, "-q", "-p", "no:cacheprovider", "-W", "ignore"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    report = child.stdout[-6000:] + child.stderr[-2000:]
    assert child.returncode == 0, f"interpreter tests failed (rc={child.returncode}):\n{report}"
    summary = [line for line in child.stdout.splitlines() if line.strip()][-1]
    assert " passed" in summary, report
    for word in ("skipped", "deselected", "failed"):
        assert word not in summary, report
