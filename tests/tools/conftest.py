"""Synthetic fork checkouts for tool tests: a tiny upstream git repo and a fork pinned to it."""

import textwrap
from pathlib import Path

import pytest

from tests.tools.bumpkit import sh  # noqa: F401  (re-exported for the tests)
from tools.rebase.paths import Layout

UPSTREAM_FILES = {
    "megatron/core/package_info.py": "MAJOR = 0\nMINOR = 42\nPATCH = 1\nPRE_RELEASE = ''\n__version__ = '0.42.1'\n",
    "megatron/core/__init__.py": "from megatron.core.package_info import __version__\n",
    "megatron/core/alpha.py": "".join(f"def alpha_{i}():\n    return {i}\n\n\n" for i in range(12)),
    "megatron/core/beta.py": "".join(f"BETA_{i} = {i}\n" for i in range(30)),
    "README.md": "synthetic upstream\n",
}


def make_upstream(path: Path, files=None) -> str:
    path.mkdir(parents=True)
    sh("git", "init", "-q", "-b", "main", cwd=path)
    for rel, text in (files or UPSTREAM_FILES).items():
        target = path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    sh("git", "add", "-A", cwd=path)
    sh("git", "commit", "-q", "-m", "upstream v0.42.1", cwd=path)
    return sh("git", "rev-parse", "HEAD", cwd=path).strip()


class Fork:
    """A fork checkout pinned to a synthetic upstream, plus helpers to grow its stack."""

    def __init__(self, root: Path, upstream: Path, commit: str):
        self.root, self.upstream, self.commit = root, upstream, commit
        self.layout = Layout(root)

    @property
    def work(self) -> Path:
        return self.layout.work

    def commit_patch(self, name, edits, subject=None, tests="tests/test_dummy.py::test_ok", body="Why it exists."):
        """Edit files in the work repo and commit them as one patch with the required trailers."""
        for rel, transform in edits.items():
            target = self.work / rel
            old = target.read_text() if target.exists() else ""
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(transform(old) if callable(transform) else transform)
        sh("git", "add", "-A", cwd=self.work)
        message = (
            f"{subject or name}\n\n{body}\n\nPatch-Name: {name}\n"
            f"Upstream-Status: fork-only test fixture\nTests: {tests}\n"
        )
        sh("git", "commit", "-q", "-m", message, cwd=self.work)

    def patch_files(self):
        return {p.name: p.read_bytes() for p in sorted(self.layout.patches.glob("*"))}


@pytest.fixture
def fork(tmp_path, monkeypatch):
    upstream = tmp_path / "upstream"
    commit = make_upstream(upstream)
    root = tmp_path / "fork"
    (root / "patches").mkdir(parents=True)
    (root / "patches" / "series").write_text("# test series\n")
    (root / "upstream.toml").write_text(
        textwrap.dedent(
            f"""\
            [upstream]
            kind = "git"
            url = "{upstream}"
            commit = "{commit}"
            """
        )
    )
    (root / "tests").mkdir()
    (root / "tests" / "test_dummy.py").write_text("def test_ok():\n    assert True\n")
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    return Fork(root, upstream, commit)
