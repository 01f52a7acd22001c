"""Fixtures of the tool tests: ``cache`` (a per-test download cache), ``find_links`` (pip's only
sdist source) and ``fork``, for the apply/export/check tests: a checkout pinned to a tiny git upstream.

``fork`` is built with the shared helpers of tests/tools/bumpkit.py; only the upstream's files differ
(functions and constants the apply/export tests edit).
"""

import os

import pytest

from tests.tools.bumpkit import make_fork, sh  # noqa: F401  (sh is re-exported for the tests)
from tests.tools.sdists import pip_sees_only

UPSTREAM_FILES = {
    "megatron/core/package_info.py": "MAJOR = 0\nMINOR = 42\nPATCH = 1\nPRE_RELEASE = ''\n__version__ = '0.42.1'\n",
    "megatron/core/__init__.py": "from megatron.core.package_info import __version__\n",
    "megatron/core/alpha.py": "".join(f"def alpha_{i}():\n    return {i}\n\n\n" for i in range(12)),
    "megatron/core/beta.py": "".join(f"BETA_{i} = {i}\n" for i in range(30)),
    "README.md": "synthetic upstream\n",
}


@pytest.fixture(autouse=True, scope="session")
def allow_synthetic_upstreams(tmp_path_factory):
    """The tests' forks pin synthetic upstreams under pytest's temporary folder; a committed git pin
    names the upstream repository only unless the environment allows another (issue 46, item 8)."""
    allowed = [str(tmp_path_factory.getbasetemp()) + "/", "https://example.invalid/", "git@example.invalid:upstream.git"]
    os.environ["FORK_REBASE_ALLOW_GIT_URL"] = ",".join(allowed)
    yield
    os.environ.pop("FORK_REBASE_ALLOW_GIT_URL", None)


@pytest.fixture
def fork(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    return make_fork(tmp_path, files=UPSTREAM_FILES)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A per-test download cache, so no test reads or fills the user's."""
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def find_links(tmp_path, monkeypatch):
    """pip sees one local find-links folder (this one) and nothing else: no index, no cache."""
    links = tmp_path / "links"
    links.mkdir()
    pip_sees_only(monkeypatch, find_links=str(links))
    return links
