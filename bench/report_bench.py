"""Benchmark (not a test): ``report`` on a synthetic 25-commit stack across 1,200 upstream commits.

The repository is built with ``git fast-import`` in a scratch directory: 60 files of 200 lines, 1,200
upstream commits each editing a few lines of one file (some next to the stack's hunks, one moving a
patch's code into a new file, one re-implementing a patch), an old stack of 25 commits on the old
base and a new one on the new base (identical, modified, squashed, split, absorbed, dropped). Prints
the median of ``--repeat`` runs of ``build_report`` (target <= 2 s) and the statuses it found.

    python bench/report_bench.py [--repeat 5]
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.rebase.git.gitcmd import hermetic_env  # noqa: E402
from tools.rebase.report.report import build_report  # noqa: E402

FILES, LINES, UPSTREAM, STACK = 60, 200, 1200, 25


class Stream:
    """A fast-import stream of whole-file commits, with the files' current texts per branch."""

    def __init__(self):
        self.parts, self.mark, self.when = [], 0, 1_700_000_000

    def commit(self, branch: str, parent, files: dict, message: str) -> int:
        self.mark += 1
        self.when += 60
        msg = message.encode()
        out = [f"commit refs/heads/{branch}\nmark :{self.mark}\n"
               f"committer Bench <bench@example.invalid> {self.when} +0000\ndata {len(msg)}\n".encode(), msg, b"\n"]
        if parent:
            out.append(f"from :{parent}\n".encode())
        for path, lines in sorted(files.items()):
            if lines is None:
                out.append(f"D {path}\n".encode())
                continue
            data = "".join(lines).encode()
            out += [f"M 100644 inline {path}\ndata {len(data)}\n".encode(), data, b"\n"]
        self.parts += out + [b"\n"]
        return self.mark


def _block(tag: str, n: int, scale: int = 1) -> list:
    return [f"    {tag}_value_{i} = compute_{tag}(batch, {i} * {scale})\n" for i in range(n)]


def _insert(files: dict, path: str, after: int, lines: list) -> None:
    files[path] = files[path][:after] + lines + files[path][after:]


def _patches(squash: bool) -> list:
    """``[(message, edit(files))]`` for one side; ``squash``: the new side's shapes."""
    out = []
    for k in range(15):  # identical or refreshed
        out.append((f"[{k + 1}/25] fork: tweak module {k}",
                    lambda f, k=k: _insert(f, f"pkg/mod_{k}.py", 30, _block(f"tweak{k}", 4))))
    for k in range(15, 19):  # modified: the new version changed two lines
        scale = 2 if squash else 1
        out.append((f"[{k + 1}/25] fork: feature {k}",
                    lambda f, k=k, s=scale: _insert(f, f"pkg/mod_{k}.py", 45, _block(f"feat{k}", 6, s)[:2] + _block(f"feat{k}", 6)[2:])))
    if squash:
        out.append(("fork: alpha (squash of #101 and #102)",
                    lambda f: _insert(f, "pkg/mod_20.py", 20, _block("alpha", 8, 3) + _block("alpha_more", 4))))
        out.append(("fork: split part 1", lambda f: _insert(f, "pkg/mod_21.py", 20, _block("split", 12)[:5])))
        out.append(("fork: split part 2", lambda f: _insert(f, "pkg/mod_22.py", 20, _block("split", 12)[5:])))
    else:
        out.append(("fork: alpha first cut (#101)", lambda f: _insert(f, "pkg/mod_20.py", 20, _block("alpha", 8))))

        def rewrite(f):
            f["pkg/mod_20.py"] = [x.replace("* 1)", "* 3)") if "alpha_value" in x else x for x in f["pkg/mod_20.py"]]
            _insert(f, "pkg/mod_20.py", 28, _block("alpha_more", 4))
        out.append(("fork: alpha, finished (#102)", rewrite))

        def whole(f):
            _insert(f, "pkg/mod_21.py", 20, _block("split", 12)[:5])
            _insert(f, "pkg/mod_22.py", 20, _block("split", 12)[5:])
        out.append(("fork: split me", whole))
        out.append(("fork: moved upstream", lambda f: _insert(f, "pkg/mod_23.py", 20, _block("movedalgo", 10))))
        out.append(("fork: rollout cache", lambda f: _insert(f, "pkg/mod_24.py", 20, [
            "    rollout_cache_entries: int = 0\n", "    def build_rollout_cache(self):\n", "        return {}\n"])))
        out.append(("fork: ours only", lambda f: _insert(f, "pkg/mod_25.py", 20, _block("ours", 5))))
    return out


def build(repo: Path) -> tuple:
    subprocess.run(["git", "init", "-q", str(repo)], check=True, env=hermetic_env({}))
    s = Stream()
    base = {f"pkg/mod_{k}.py": [f"mod {k} line {i}\n" for i in range(LINES)] for k in range(FILES)}
    b0 = s.commit("main", None, base, "upstream 1.0")
    files, parent = {p: list(v) for p, v in base.items()}, b0
    for n in range(UPSTREAM):
        k = n % FILES
        path = f"pkg/mod_{k}.py"
        row = 46 if n in (915, 976) else 100 + (n // FILES) % 90  # two next to a modified patch's hunk
        files[path][row] = files[path][row].rstrip("\n") + f" upstream {n}\n"
        change = {path: files[path]}
        message = f"upstream change {n}"
        if n == 600:
            change["pkg/ops/moved.py"] = ["def moved():\n"] + _block("movedalgo", 10)
            message = "upstream: move the algorithm into ops"
        if n == 900:
            change["pkg/cache.py"] = ["class CacheConfig:\n", "    rollout_cache_entries: int = 64\n",
                                      "def build_rollout_cache(cfg):\n", "    return dict.fromkeys(range(cfg.rollout_cache_entries))\n"]
            message = "Add a rollout cache"
        parent = s.commit("main", parent, change, message)
    b1 = parent
    tips = []
    for branch, start, squash in (("old", base, False), ("new", files, True)):
        state, at = {p: list(v) for p, v in start.items()}, b0 if branch == "old" else b1
        for message, edit in _patches(squash):
            before = {p: list(v) for p, v in state.items()}
            edit(state)
            at = s.commit(branch, at, {p: v for p, v in state.items() if before.get(p) != v}, message)
        tips.append(at)
    subprocess.run(["git", "fast-import", "--quiet"], cwd=repo, input=b"".join(s.parts), check=True, env=hermetic_env({}))
    rev = lambda mark: subprocess.run(["git", "rev-parse", f"refs/heads/{mark}"], cwd=repo, capture_output=True,  # noqa: E731
                                      text=True, check=True).stdout.strip()
    b0_sha = subprocess.run(["git", "rev-list", "--max-parents=0", "main"], cwd=repo, capture_output=True, text=True,
                            check=True).stdout.strip()
    return b0_sha, rev("old"), rev("main"), rev("new")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="report-bench-") as tmp:
        repo = Path(tmp) / "repo"
        t = time.perf_counter()
        b0, old_tip, b1, new_tip = build(repo)
        print(f"(setup) {UPSTREAM} upstream commits, {STACK}-commit old stack, fast-import: {time.perf_counter() - t:.2f} s")
        times, data = [], None
        for _ in range(args.repeat):
            t = time.perf_counter()
            data = build_report(repo, b0, old_tip, b1, new_tip)
            times.append(time.perf_counter() - t)
        counts = ", ".join(f"{n} {s}" for s, n in data["counts"].items() if n)
        reasons = sum(len(e.get("reasons", [])) for e in data["mapping"])
        print(f"report: {data['old']['count']} old / {data['new']['count']} new commits across {UPSTREAM} upstream "
              f"commits: {counts}; {reasons} Reason lines")
        print(f"report: median {statistics.median(times):.2f} s (runs: {', '.join(f'{x:.2f}' for x in times)}; "
              f"target <= 2 s)")


if __name__ == "__main__":
    main()
