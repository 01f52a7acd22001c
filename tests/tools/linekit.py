"""A toy upstream that packages itself (as Megatron-LM's own pyproject does), with history, and a
fork checkout whose release line and line ``dev`` sit on two of its commits: for the publish, archive
and line-install tests, which must run without GitHub (CI has none)."""

import io
import subprocess
import tarfile
from pathlib import Path

from tests.tools.bumpkit import UPSTREAM_FILES, commit, commit_checkout, ignore_generated, init, make_fork, \
    replace_line, sh

PYPROJECT = """[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "megatron-core"
version = "0.42.1"

[tool.setuptools.packages.find]
include = ["megatron*"]
"""
PACKAGED_UPSTREAM = {**UPSTREAM_FILES, "pyproject.toml": PYPROJECT, "README.md": "toy upstream\n",
                     "tools/run.sh": "#!/bin/sh\necho run\n"}
ALPHA, BETA = "megatron/core/alpha.py", "megatron/core/beta.py"
RELEASE_STACK = [("alpha-fork", {ALPHA: replace_line("alpha line 10\n", "alpha line 10 fork\n")})]
DEV_STACK = [("alpha-fork", {ALPHA: replace_line("alpha line 10\n", "alpha line 10 fork\n")}),
             ("beta-dev", {BETA: replace_line("beta line 5\n", "beta line 5 dev\n")})]


def packaged_upstream(tmp_path: Path) -> tuple[Path, str, str]:
    """``tmp_path/upstream``: v1 (the release line's base), then dev work with an executable and a
    link outside megatron/; returns the repo and the two commits."""
    upstream = tmp_path / "upstream"
    v1 = init(upstream, PACKAGED_UPSTREAM, "upstream v1")
    sh("git", "tag", "v1", cwd=upstream)
    (upstream / "tools" / "run.sh").chmod(0o755)
    (upstream / "docs").mkdir()
    (upstream / "docs" / "link.md").symlink_to("../README.md")
    dev = commit(upstream, {"megatron/core/gamma.py": lambda t: t + "gamma dev\n"}, "upstream dev work",
                 date="2026-02-01T00:00:00Z")
    sh("git", "branch", "dev", cwd=upstream)
    return upstream, v1, dev


def fork_with_dev_line(tmp_path: Path, dev_pin_extra: str = ""):
    """The committed fork: the release line (``RELEASE_STACK`` on v1) and line ``dev``
    (``DEV_STACK`` on the dev commit, ``dev_pin_extra`` appended to its pin)."""
    from tests.tools.bumpkit import add_line

    upstream, v1, dev = packaged_upstream(tmp_path)
    fork = make_fork(tmp_path)
    fork.stack(RELEASE_STACK)
    pin = f'[upstream]\nkind = "git"\nurl = "{upstream}"\ncommit = "{dev}"\n{dev_pin_extra}'
    line = add_line(fork, "dev", pin_text=pin)
    line.stack(DEV_STACK)
    ignore_generated(fork)
    commit_checkout(fork, "fork with a dev line")
    return fork, line, dev


def git_archive(repo: Path, commit_id: str, top: str = "Megatron-LM") -> bytes:
    """The tar.gz ``git archive`` makes of a commit, as GitHub serves it (one top folder)."""
    return subprocess.run(["git", "-C", str(repo), "archive", "--format=tar.gz", f"--prefix={top}-{commit_id}/",
                           commit_id], capture_output=True, check=True).stdout


def retarred(data: bytes, change) -> bytes:
    """``data`` (a tar.gz) rewritten with ``change(name, bytes) -> bytes`` applied to each file."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data)) as src, tarfile.open(fileobj=out, mode="w:gz") as dst:
        for member in src:
            payload = src.extractfile(member).read() if member.isfile() else None
            if payload is not None:
                payload = change(member.name, payload)
                member.size = len(payload)
            dst.addfile(member, io.BytesIO(payload) if payload is not None else None)
    return out.getvalue()
