"""A pristine-upstream oracle: run one seeded scenario on unpatched upstream and on the fork.

"Flag off equals upstream" must be checked against upstream's own code, never against the
patched code with a flag off. The pinned base (the sdist named in ``upstream.toml``, sha256-verified
by the rebase tool's own pin and source code; or the pinned git commit) is extracted once per
session into a temporary directory. Each side runs in its own Python subprocess that imports
``megatron`` from one tree only -- the pristine extraction or this checkout's ``megatron/`` -- and
the same scenario (``tests/unit_tests/upstream_scenarios.py``), so the two results differ only by
the code under test.
"""

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

from tests.unit_tests.test_utilities import CPU_ONLY_PREAMBLE, cpu_only_environment

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = "tests.unit_tests.upstream_scenarios"


def _cache_dir() -> Path:
    return Path(os.environ.get("FORK_REBASE_CACHE") or ROOT / ".rebase" / "cache")


def extract_pristine(dest: Path) -> Path:
    """Extract the verified pinned base into ``dest``; return the directory holding ``megatron/``.

    ``FORK_PRISTINE_TREE`` names an already extracted base instead (a machine with no network and
    no cache, such as the GPU hosts); it is the caller's word that it is the pinned one.
    """
    given = os.environ.get("FORK_PRISTINE_TREE")
    if given:
        if not (Path(given) / "megatron" / "core" / "__init__.py").is_file():
            raise ValueError(f"FORK_PRISTINE_TREE={given}: no megatron/core/__init__.py under it")
        return Path(given)
    from tools.rebase.stack.pin import load_pin
    from tools.rebase.stack.gitsource import fetch_git_commit
    from tools.rebase.stack.source import _extract_sdist, fetch_verified_sdist

    # The pin of the stack under test: a bump names its new base here while it tests (the
    # checkout's upstream.toml is still the old one, a line's lives in lines/NAME/).
    pin = load_pin(Path(os.environ.get("FORK_REBASE_TESTED_PIN") or ROOT / "upstream.toml"))
    if pin.kind == "pypi":
        top, _ = _extract_sdist(fetch_verified_sdist(_cache_dir(), pin), dest)
        return top
    from tools.rebase.git.gitcmd import git

    repo = dest / "git"
    repo.mkdir()
    git("init", "-q", "--bare", cwd=repo)
    fetch_git_commit(repo, _cache_dir(), pin.url, pin.commit)
    archive = dest / "base.tar"
    archive.write_bytes(git("archive", "--format=tar", pin.commit, "megatron", cwd=repo, binary=True))
    top = dest / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(top, filter="data")
    return top


class Oracle:
    """Runs scenarios on the pristine tree and on the fork; results are cached per session."""

    def __init__(self, pristine: Path, fork: Path = ROOT):
        self.pristine, self.fork = Path(pristine), Path(fork)
        self._cache = {}

    def run(self, side: str, specs: list) -> list:
        """Run ``specs`` (scenario dicts) in one subprocess on ``side`` ('upstream' or 'fork')."""
        tree = self.pristine if side == "upstream" else self.fork
        keys = [(side, json.dumps(s, sort_keys=True)) for s in specs]
        todo = [s for k, s in zip(keys, specs) if k not in self._cache]
        if todo:
            for key, result in zip([(side, json.dumps(s, sort_keys=True)) for s in todo],
                                   run_in_subprocess(tree, todo)):
                self._cache[key] = result
        return [self._cache[k] for k in keys]

    def compare(self, specs: list, fork_config=None, fork_forward=None, fork_mutation=None):
        """Run ``specs`` on both sides (the fork with extra flag-off ``fork_config`` fields and
        forward arguments) and assert outputs, gradients and state dicts are identical."""
        fork_specs = [dict(s, config=dict(s.get("config", {}), **(fork_config or {})),
                           forward=dict(s.get("forward", {}), **(fork_forward or {})),
                           mutation=fork_mutation) for s in specs]
        upstream = self.run("upstream", specs)
        fork = self.run("fork", fork_specs)
        for spec, theirs, ours in zip(specs, upstream, fork):
            assert_same(theirs, ours, label=spec.get("name", spec["scenario"]))
        return upstream, fork


def run_in_subprocess(tree: Path, specs: list) -> list:
    """Import ``megatron`` from ``tree`` (and nothing else of it) in a fresh interpreter; run specs."""
    with tempfile.TemporaryDirectory(prefix="oracle-") as tmp:
        out = Path(tmp) / "results.pt"
        # The comparison is bitwise on the CPU, on any host: no visible GPU, and Transformer
        # Engine / APEX turned away (their kernels only take CUDA tensors).
        code = (
            f"{CPU_ONLY_PREAMBLE}; sys.path[:0] = [sys.argv[1], sys.argv[2]]; "
            f"from {SCENARIOS} import main; main(sys.argv[3], sys.argv[4])"
        )
        # No flag may leak in by environment, nor the rendezvous of this process's own group
        # (a test that initialized torch.distributed holds MASTER_PORT).
        env = cpu_only_environment(drop_prefixes=("OPEN_TRAINING_", "PYTHON"))
        proc = subprocess.run(
            [sys.executable, "-c", code, str(tree), str(ROOT), json.dumps(specs), str(out)],
            cwd=tmp, env=env, capture_output=True, text=True,
        )
        if proc.returncode != 0 or not out.is_file():
            raise AssertionError(f"scenario run on {tree} failed (exit {proc.returncode}):\n"
                                 f"{(proc.stdout + proc.stderr)[-4000:]}")
        results = torch.load(out, weights_only=False)
    expected = (tree / "megatron" / "core" / "__init__.py").resolve()
    for result in results:
        assert Path(result["megatron_file"]).resolve() == expected, (
            f"the scenario imported {result['megatron_file']}, not the tree under test {tree}")
    return results


def _diff(a, b, what: str, key: str):
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return None if a == b else f"{what} {key}: {a!r} != {b!r}"
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{what} {key}: {tuple(a.shape)} {a.dtype} != {tuple(b.shape)} {b.dtype}"
    if not torch.equal(a, b):
        diff = (a.double() - b.double()).abs().max().item()
        return f"{what} {key}: values differ (max abs diff {diff:.3g})"
    return None


def assert_same(upstream: dict, fork: dict, label: str = "scenario") -> None:
    """Bitwise equality of every output, gradient and state-dict entry, and of their key sets."""
    problems = []
    for what in ("outputs", "grads", "state_dict"):
        theirs, ours = upstream[what], fork[what]
        if set(theirs) != set(ours):
            problems.append(f"{what} keys: only upstream {sorted(set(theirs) - set(ours))}, "
                            f"only fork {sorted(set(ours) - set(theirs))}")
        for key in sorted(set(theirs) & set(ours)):
            why = _diff(theirs[key], ours[key], what, key)
            if why:
                problems.append(why)
    assert not problems, f"{label}: the fork (flags off) differs from pristine upstream:\n  " + \
        "\n  ".join(problems[:20])


MOE = {"num_moe_experts": 4, "moe_router_topk": 2, "moe_token_dispatcher_type": "allgather"}
MTP = {"mtp_num_layers": 1}


def gpt_spec(name: str, options=None, **config) -> dict:
    """A ``gpt`` scenario (tests/unit_tests/upstream_scenarios.py) with upstream config fields;
    ``options`` are the scenario's own keyword arguments (``experts``, ``router_gemm``)."""
    spec = {"scenario": "gpt", "name": name, "config": config}
    if options:
        spec["options"] = dict(options)
    return spec


def moe_bf16_specs(**config) -> list:
    """The MoE shapes where a flag on the routed experts changes numbers: a bf16 model, with
    SequentialMLP and grouped experts, under the allgather and the alltoall dispatcher."""
    extra = "".join(f", {key}={value}" for key, value in sorted(config.items()))
    return [
        gpt_spec(
            f"MoE bf16 {experts} {dispatcher}{extra}",
            options={"experts": experts},
            **dict(MOE, moe_token_dispatcher_type=dispatcher, bf16=True, **config),
        )
        for experts in ("sequential", "grouped")
        for dispatcher in ("allgather", "alltoall")
    ]


def assert_parity_can_fail(oracle: "Oracle", specs: list, forced_on: dict) -> None:
    """The flag-off parity check over ``specs`` is able to fail: the same scenarios with the
    feature forced on (``forced_on``: its config fields) must differ from pristine upstream in
    every scenario, or the scenario does not reach the code the flag switches."""
    fork_specs = [dict(s, config=dict(s.get("config", {}), **forced_on)) for s in specs]
    upstream, fork = oracle.run("upstream", specs), oracle.run("fork", fork_specs)
    for spec, theirs, ours in zip(specs, upstream, fork):
        try:
            assert_same(theirs, ours, label=spec["name"])
        except AssertionError as error:
            assert "differs from pristine upstream" in str(error), error
        else:
            raise AssertionError(
                f"{spec['name']}: with {forced_on} the fork still equals pristine upstream; the "
                "parity check cannot tell the feature on from off in this scenario"
            )


# The shapes most parity tests need; sharing them lets the session reuse upstream's results.
DENSE_MTP = gpt_spec("dense+MTP", **MTP)
MOE_MTP = gpt_spec("MoE+MTP", **MOE, **MTP)
