"""Helpers of the hostile pull request tests (issue 22): a fork checkout committed as a maintainer
would, a pull request that commits a payload in a scratch clone, and the clone CI makes of it."""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.tools.bumpkit import commit_checkout, ignore_generated, make_fork, replace_line, sh

REPO_ROOT = Path(__file__).resolve().parents[2]
A, B = "megatron/core/alpha.py", "megatron/core/beta.py"
STACK = [
    ("keep-alpha", {A: replace_line("alpha line 10\n", "alpha line 10 fork\n")}),
    ("tweak-beta", {B: replace_line("beta line 5\n", "beta line 5 fork\n")}),
]


def committed_fork(tmp_path: Path, stack=STACK, files=None):
    """A fork checkout with ``stack`` exported and the whole checkout committed (megatron/ and
    .rebase/ ignored, as in the real repository)."""
    fork = make_fork(tmp_path, files=files)
    fork.stack(stack)
    ignore_generated(fork)
    commit_checkout(fork, "fork")
    return fork


def pull_request(fork, tmp_path: Path, payload, name="ci") -> Path:
    """Commit ``payload(clone)``'s files in a scratch clone of the fork (``git add -f``: a PR can
    commit ignored paths), then clone that the way CI checks a pull request out; return the CI
    clone."""
    pr = tmp_path / f"{name}-pr"
    sh("git", "clone", "-q", str(fork.root), str(pr), cwd=tmp_path)
    payload(pr)
    sh("git", "add", "-f", "-A", ".", cwd=pr)
    sh("git", "commit", "-q", "--allow-empty", "-m", "hostile pull request", cwd=pr)
    ci = tmp_path / name
    sh("git", "clone", "-q", str(pr), str(ci), cwd=tmp_path)
    return ci


def tool_env(env=None, cache=None) -> dict:
    """The environment CI runs the tool with: this one's, the cache named (or the default)."""
    full = {k: v for k, v in os.environ.items() if k not in ("FORK_REBASE_CACHE", "MEGATRON_REBASE_IN_CHECKOUT")}
    if cache is not None:
        full["FORK_REBASE_CACHE"] = str(cache)
    full.update(env or {})
    return full


def start_tool(checkout: Path, *args, env=None, cache=None, runner=()) -> subprocess.Popen:
    """Start ``python -m tools.rebase -C checkout ARGS`` (this repository's tool) without waiting;
    ``runner`` is a command prefix it runs under (``setpriv ...``)."""
    return subprocess.Popen([*runner, sys.executable, "-m", "tools.rebase", "-C", str(checkout), *args],
                            cwd=REPO_ROOT, env=tool_env(env, cache), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def tool(checkout: Path, *args, env=None, cache=None, runner=()):
    """Run ``python -m tools.rebase -C checkout ARGS`` as CI would (this repository's tool)."""
    proc = start_tool(checkout, *args, env=env, cache=cache, runner=runner)
    out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def unpacked_archive(tmp_path: Path, ci: Path, keep) -> Path:
    """``ci`` as a tarball of it unpacks (no ``.git``, as a release archive or a CI artifact),
    with the parts of ``.rebase/`` that ``keep`` accepts."""
    archive = tmp_path / "pr.tar"

    def only(info):
        rel = Path(info.name).relative_to("checkout")
        if rel.parts[:1] == (".git",) or (rel.parts[:1] == (".rebase",) and len(rel.parts) > 1 and not keep(rel)):
            return None
        return info

    with tarfile.open(archive, "w") as tar:
        tar.add(ci, arcname="checkout", filter=only)
    unpacked = tmp_path / "unpacked"
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="tar")
    return unpacked / "checkout"
