"""Benchmark (not a test): time ``bump`` against raw ``git rebase --onto`` + ``git range-diff``.

Two scenarios, each on the same input for both sides (the same work repo, both bases imported):
a 12-patch stack bumped from the megatron-core 0.19.0 sdist to 0.19.2, and (with ``--mirror``) a
stack bumped across hundreds of upstream git commits (default ``main~300`` -> ``main``), its
history read in place from a local mirror. Prints medians of ``--repeat`` runs (default 5), the
ratio ours/raw (target <= 1.5x) and the time to regenerate the report (target <= 2 s).

    FORK_REBASE_CACHE=/path/to/cache python bench/rebase_bench.py [--repeat 5] \
        [--mirror PATH-TO-A-MEGATRON-LM-CLONE [--old main~300] [--new main]] [--keep DIR]

The sdists come from $FORK_REBASE_CACHE/sdist (downloaded with pip when missing).
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.rebase.bump.bump import bump  # noqa: E402
from tools.rebase.bump.lastreport import report_last_bump  # noqa: E402
from tools.rebase.git.gitcmd import hermetic_env  # noqa: E402
from tools.rebase.git.paths import Layout  # noqa: E402
from tools.rebase.stack.pin import Pin  # noqa: E402
from tools.rebase.report.report import write_report  # noqa: E402
from tools.rebase.stack.gitsource import use_mirror  # noqa: E402
from tools.rebase.stack.source import download_sdist, import_base, sha256_file  # noqa: E402
from tools.rebase.stack.workrepo import apply, export  # noqa: E402

OLD, NEW = "0.19.0", "0.19.2"
UPSTREAM_URL = "https://github.com/NVIDIA/Megatron-LM.git"
CORE = "megatron/core/"


def _replace(old, new):
    def edit(text):
        if old not in text:
            raise SystemExit(f"benchmark stack is stale: {old!r} not found")
        return text.replace(old, new, 1)
    return edit


def _append(extra):
    return lambda text: text + extra


# Twelve patches: two in files 0.19.2 changes (one only drifts context, one is absorbed upstream),
# the rest spread over MoE, attention, config, model and optimizer files.
STACK = [
    ("mtp-typing-note", CORE + "transformer/multi_token_prediction.py",
     _replace("from typing import TYPE_CHECKING, Callable, List, Optional, Union\n",
              "from typing import TYPE_CHECKING, Callable, List, Optional, Union  # fork\n")),
    ("mtp-unpack-style", CORE + "transformer/multi_token_prediction.py",
     _replace("(hidden_states, input_ids, position_ids, padding_mask) = self.layers[layer_idx](",
              "hidden_states, input_ids, position_ids, padding_mask = self.layers[layer_idx](")),
    ("layer-marker", CORE + "transformer/transformer_layer.py", _append("\n# fork: layer marker\n")),
    ("schedule-plan-marker", CORE + "models/common/model_chunk_schedule_plan.py",
     _append("\n# fork: schedule plan marker\n")),
    ("router-marker", CORE + "transformer/moe/router.py", _append("\n# fork: router marker\n")),
    ("moe-utils-marker", CORE + "transformer/moe/moe_utils.py", _append("\n# fork: moe utils marker\n")),
    ("config-marker", CORE + "transformer/transformer_config.py", _append("\n# fork: config marker\n")),
    ("attention-marker", CORE + "transformer/attention.py", _append("\n# fork: attention marker\n")),
    ("mlp-marker", CORE + "transformer/mlp.py", _append("\n# fork: mlp marker\n")),
    ("gpt-model-marker", CORE + "models/gpt/gpt_model.py", _append("\n# fork: gpt model marker\n")),
    ("optimizer-marker", CORE + "optimizer/__init__.py", _append("\n# fork: optimizer marker\n")),
    ("rl-extra-module", CORE + "fork_rl_extra.py", lambda _text: "FORK_RL_EXTRA = True\n"),
]


def _commit(work: Path, name: str, rel: str, edit) -> None:
    path = work / rel
    path.write_text(edit(path.read_text() if path.exists() else ""))
    env = hermetic_env({"GIT_AUTHOR_NAME": "Bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
                        "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"})
    msg = f"{name}\n\nBenchmark patch.\n\nPatch-Name: {name}\nUpstream-Status: fork-only bench\nTests: tests\n"
    for args in (["add", "-A"], ["commit", "-q", "-m", msg]):
        subprocess.run(["git", *args], cwd=work, env=env, check=True, capture_output=True)


def make_template(dest: Path, cache: Path):
    """The STACK exported on the OLD sdist, NEW imported too; return (its layout, the NEW pin)."""
    (dest / "patches").mkdir(parents=True)
    (dest / "patches" / "series").write_text("# benchmark series\n")
    (dest / "tests").mkdir()
    old = Pin("pypi", package="megatron-core", version=OLD,
              sha256=sha256_file(download_sdist(cache, "megatron-core", OLD)))
    (dest / "upstream.toml").write_text(old.to_toml())
    layout = Layout(dest)
    apply(layout, log=lambda *_: None)
    for name, rel, edit in STACK:
        _commit(layout.work, name, rel, edit)
    export(layout, log=lambda *_: None)
    new = Pin("pypi", package="megatron-core", version=NEW,
              sha256=sha256_file(download_sdist(cache, "megatron-core", NEW)))
    t = time.perf_counter()
    import_base(layout.work, cache, new)  # both sides start with both bases imported
    print(f"(setup) importing the {NEW} sdist as a base commit: {time.perf_counter() - t:.2f} s")
    return layout, new


def raw_git(work: Path, old_base: str, old_tip: str, new_base: str) -> float:
    env = hermetic_env({"GIT_AUTHOR_NAME": "Bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid"})
    t = time.perf_counter()
    subprocess.run(["git", "checkout", "-q", "-B", "raw", old_tip], cwd=work, env=env, check=True)
    subprocess.run(["git", "rebase", "-q", "--onto", new_base, old_base, "raw"], cwd=work, env=env,
                   check=True, capture_output=True)
    subprocess.run(["git", "range-diff", "--no-color", f"{old_base}..{old_tip}", f"{new_base}..raw"],
                   cwd=work, env=env, check=True, capture_output=True)
    return time.perf_counter() - t


def make_git_template(dest: Path, cache: Path, mirror: str, old_rev: str, new_rev: str):
    """A stack of the append-style patches on upstream ``old_rev``; ``new_rev`` imported too."""
    from tools.rebase.git.gitcmd import git

    use_mirror(UPSTREAM_URL, mirror)
    commits = git("rev-parse", f"{old_rev}^{{commit}}", f"{new_rev}^{{commit}}", cwd=mirror).split()
    count = git("rev-list", "--count", f"{commits[0]}..{commits[1]}", cwd=mirror).strip()
    (dest / "patches").mkdir(parents=True)
    (dest / "patches" / "series").write_text("# benchmark series\n")
    (dest / "tests").mkdir()
    # A pin's ref must be a plain name: "main~300" is recorded by its commit only.
    old_ref = old_rev if re.fullmatch(r"[A-Za-z0-9._/-]+", old_rev) and ".." not in old_rev else ""
    (dest / "upstream.toml").write_text(Pin("git", url=UPSTREAM_URL, commit=commits[0], ref=old_ref).to_toml())
    layout = Layout(dest)
    apply(layout, log=lambda *_: None)
    for name, rel, edit in STACK:
        if name.startswith("mtp-"):
            continue  # those two edit 0.19 text; the rest append or add files
        _commit(layout.work, name, rel, edit)
    export(layout, log=lambda *_: None)
    new = Pin("git", url=UPSTREAM_URL, commit=commits[1], ref=new_rev)
    t = time.perf_counter()
    import_base(layout.work, cache, new)
    print(f"(setup) importing {new_rev} ({count} upstream commits after {old_rev}) as a base commit, "
          f"history read in place: {time.perf_counter() - t:.2f} s")
    return layout, new, f"git:{UPSTREAM_URL}@{new_rev}", f"git {old_rev} -> {new_rev} ({count} upstream commits)"


def run_scenario(tmp: Path, label: str, template: Layout, new_pin, spec: str, repeat: int, keep=None):
    from tools.rebase.git.gitcmd import git
    from tools.rebase.stack.pin import load_pin
    from tools.rebase.stack.source import base_tag

    old_base = git("rev-parse", f"refs/tags/{base_tag(load_pin(template.pin))}", cwd=template.work).strip()
    old_tip = git("rev-parse", "HEAD", cwd=template.work).strip()
    new_base = git("rev-parse", f"refs/tags/{base_tag(new_pin)}", cwd=template.work).strip()
    ours, raw, report = [], [], []
    load0 = f"{os.getloadavg()[0]:.2f}"
    for i in range(repeat):
        # Alternate the two sides so machine load hits both alike.
        raw_dir = tmp / f"{label[:3]}-raw{i}"
        shutil.copytree(template.work, raw_dir, symlinks=True)
        run_dir = tmp / f"{label[:3]}-run{i}"
        shutil.copytree(template.root, run_dir, symlinks=True)
        layout = Layout(run_dir)
        if i % 2:
            raw.append(raw_git(raw_dir, old_base, old_tip, new_base))
        t = time.perf_counter()
        data = bump(layout, spec, log=lambda *_: None, run_tests=False)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        write_report(report_last_bump(layout), layout.report_md, layout.report_json)
        report.append(time.perf_counter() - t)
        if not i % 2:
            raw.append(raw_git(raw_dir, old_base, old_tip, new_base))
        if keep and i == repeat - 1:
            shutil.copytree(run_dir, keep, dirs_exist_ok=True)
        shutil.rmtree(raw_dir, ignore_errors=True)
        shutil.rmtree(run_dir, ignore_errors=True)
    counts = ", ".join(f"{n} {s}" for s, n in data["counts"].items() if n)
    runs = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    med_ours, med_raw, med_rep = statistics.median(ours), statistics.median(raw), statistics.median(report)
    print(f"\n== {label}: {data['old']['count']} patches; report: {counts}")
    print(f"load average before/after: {load0} / {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    print(f"ours (bump: replay, lint, absorbed detection, export, report): median {med_ours:.2f} s (runs: {runs(ours)})")
    print(f"raw git rebase --onto + git range-diff:                      median {med_raw:.2f} s (runs: {runs(raw)})")
    print(f"ratio ours/raw (median of {repeat}): {med_ours / med_raw:.2f}x (target <= 1.5x)")
    print(f"report regeneration: median {med_rep:.2f} s (runs: {runs(report)}; target <= 2 s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--mirror", help="a local clone of Megatron-LM: adds the git scenario")
    ap.add_argument("--old", default="main~300", help="git scenario: old upstream revision")
    ap.add_argument("--new", default="main", help="git scenario: new upstream revision")
    ap.add_argument("--only-git", action="store_true", help="skip the sdist scenario")
    ap.add_argument("--keep", help="keep the last bumped checkout of the last scenario here")
    args = ap.parse_args()
    cache = Path(os.environ.get("FORK_REBASE_CACHE") or Path(tempfile.gettempdir()) / "fork-rebase-bench-cache")
    os.environ["FORK_REBASE_CACHE"] = str(cache)
    tmp = Path(tempfile.mkdtemp(prefix="rebase-bench-"))
    try:
        if not args.only_git:
            template, new_pin = make_template(tmp / "sdist-template", cache)
            run_scenario(tmp, f"sdist {OLD} -> {NEW}", template, new_pin, f"pypi:megatron-core=={NEW}",
                         args.repeat, None if args.mirror else args.keep)
        if args.mirror:
            template, new_pin, spec, label = make_git_template(tmp / "git-template", cache, args.mirror,
                                                               args.old, args.new)
            run_scenario(tmp, label, template, new_pin, spec, args.repeat, args.keep)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
