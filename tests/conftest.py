"""Session-wide test setup: the ``gpu`` marker skips cleanly where CUDA is absent."""

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped on CPU-only machines")
    config.addinivalue_line("markers", "multi_gpu(n): needs at least n CUDA devices")


def pytest_collection_modifyitems(config, items):
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "gpu" in item.keywords and have == 0:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        marker = item.get_closest_marker("multi_gpu")
        if marker is not None and have < (marker.args[0] if marker.args else 2):
            item.add_marker(pytest.mark.skip(reason=f"needs {marker.args[0] if marker.args else 2} CUDA devices"))
