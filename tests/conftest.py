"""Session-wide test setup: the ``gpu`` marker skips cleanly where CUDA is absent.

Triton-interpreter cases (``triton_interpreter_child``) only work in a process started with
``TRITON_INTERPRET=1``; a parent test runs them in such a subprocess. Elsewhere they are
deselected, not skipped, so that "skipped" in a summary means "needs a GPU or Transformer Engine".
"""

import os

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped on CPU-only machines")
    config.addinivalue_line("markers", "multi_gpu(n): needs at least n CUDA devices")
    config.addinivalue_line(
        "markers", "triton_interpreter_child: runs only under TRITON_INTERPRET=1, in its parent test's subprocess"
    )


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TRITON_INTERPRET") != "1":
        children = [item for item in items if "triton_interpreter_child" in item.keywords]
        if children:
            config.hook.pytest_deselected(items=children)
            items[:] = [item for item in items if "triton_interpreter_child" not in item.keywords]
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "gpu" in item.keywords and have == 0:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        marker = item.get_closest_marker("multi_gpu")
        if marker is not None and have < (marker.args[0] if marker.args else 2):
            item.add_marker(pytest.mark.skip(reason=f"needs {marker.args[0] if marker.args else 2} CUDA devices"))
