"""Rehearse a line's bump onto upstream states nobody bumped onto before.

    python -m bench.bump_rehearsal --mirror PATH [--line upstream-dev] [--scenario NAME ...]
        [--tests N] [--json OUT] [--work DIR]

Each scenario is an upstream state built from the mirror (a local clone of NVIDIA/Megatron-LM) in
a scratch bare clone that shares its objects (``git clone --shared``; the mirror is only read): an
upstream branch (an open pull request, or ``main``) merged onto the line's pin with ``git
merge-tree``. A file both sides changed in conflicting ways takes the merged branch's version
whole (a sync where that side wins), and the count of such files is recorded. The line is then
bumped onto that state in a scratch clone of this checkout's committed HEAD, as a maintainer
would with only the tool: at every stop the stop's data is recorded (conflict types, causes and
how the code went, the other lines' versions that apply), then the stop is resolved by
``--take-from LINE`` where a line's version applies to every conflicted file, else dropped
(``--drop``), as the dry run does. The finished line is applied and the ``Tests:`` of the patches
whose stops were resolved (up to ``--tests`` ids, 0 to skip) are run with pytest; what ran and how
it went is recorded, with the time of each step.

Rehearsal pins are not on an upstream branch, so the run sets FORK_REBASE_ALLOW_UNANCHORED_PIN=1
(the anchoring check's override) and passes --allow-broken-premise (the premise check's findings
are recorded, not obeyed: the point is to see the whole bump).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
URL = "https://github.com/NVIDIA/Megatron-LM.git"
# name -> (branch of the mirror merged onto the pin, what it stands for)
SCENARIOS = {
    "pr-6756": ("pull-request/6756", "an open pull request syncing main into dev (390 commits, 1374 files)"),
    "pr-3635": ("pull-request/3635", "an open pull request against dev (30 commits, 4 of the line's files)"),
    "pr-6473": ("pull-request/6473", "an open pull request against dev (3 commits, 3 of the line's files)"),
    "sync-main": ("main", "upstream main merged onto the pin, main winning the 246 conflicting files"),
}


def sh(*args, cwd=None, env=None, check=True, input=None) -> str:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, input=input)
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def git(repo, *args, env=None, check=True, input=None) -> str:
    return sh("git", "-C", repo, *args, env=env, check=check, input=input)


def build_state(upstream: Path, pin: str, branch: str, name: str) -> dict:
    """Merge ``branch`` onto ``pin`` in the bare ``upstream``; return the commit and the conflict count."""
    proc = subprocess.run(["git", "-C", str(upstream), "merge-tree", "--write-tree", "--name-only", pin, branch],
                          capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"merge-tree {pin} {branch}: {proc.stderr}")
    lines = proc.stdout.split("\n")
    tree, conflicted = lines[0].strip(), []
    for line in lines[1:]:
        if not line:
            break
        conflicted.append(line)
    conflicted = sorted(set(conflicted))
    if conflicted:  # the merged branch's version wins each conflicting file
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, GIT_INDEX_FILE=str(Path(tmp) / "index"))
            git(upstream, "read-tree", tree, env=env)
            feed = []  # --index-info works in a bare repository; mode 0 removes the path
            for path in conflicted:
                entry = git(upstream, "ls-tree", branch, "--", path, env=env).split()
                feed.append(f"{entry[0]} {entry[2]}\t{path}\n" if entry else f"0 {'0' * 40}\t{path}\n")
            git(upstream, "update-index", "--index-info", env=env, input="".join(feed))
            tree = git(upstream, "write-tree", env=env).strip()
    ident = dict(os.environ, GIT_AUTHOR_NAME="rehearsal", GIT_AUTHOR_EMAIL="rehearsal@example.invalid",
                 GIT_COMMITTER_NAME="rehearsal", GIT_COMMITTER_EMAIL="rehearsal@example.invalid",
                 GIT_AUTHOR_DATE="2026-09-01T00:00:00Z", GIT_COMMITTER_DATE="2026-09-01T00:00:00Z")
    commit = git(upstream, "commit-tree", tree, "-p", pin, "-p", branch, "-m", f"rehearsal: {branch} onto the pin",
                 env=ident).strip()
    git(upstream, "update-ref", f"refs/heads/rehearsal/{name}", commit)
    return {"commit": commit, "branch": branch, "conflicted_files_taken_from_branch": len(conflicted),
            "upstream_commits": int(git(upstream, "rev-list", "--count", f"{pin}..{commit}").strip())}


def _stop_record(layout, journal):
    j = journal.load(layout)
    s = j.stopped
    rec = {"patch": j.names[s.index], "kind": s.kind, "files": s.files}
    if s.analysis:
        a = s.analysis
        rec["types"] = sorted(set(a["types"].values()))
        rec["causes"] = [{"commit": c["commit"][:12], "how": c.get("how", "")} for c in a["causes"]]
        rec["lent"] = {c["line"]: {"resolves": sorted(c["files"]), "not": c["missing"]} for c in a.get("lent", [])}
    else:
        rec["findings"] = [f["message"] for f in s.findings]
    return rec


def rehearse(fork: Path, line: str, upstream: Path, state: dict, tests: int, log) -> dict:
    """Bump ``line`` of the checkout ``fork`` onto ``state`` (dry run first), resolve every stop by
    policy, then apply and run the resolved patches' tests."""
    sys.path.insert(0, str(ROOT))
    from tools.rebase.bump import forecast, journal
    from tools.rebase.bump.bump import Stopped, bump, bump_continue
    from tools.rebase.git.paths import Layout
    from tools.rebase.stack.source import use_mirror

    layout = Layout(fork, line)
    spec = f"git:{URL}@{state['commit']}"
    use_mirror(URL, str(upstream))
    out = {"state": state}
    t = time.monotonic()
    data = forecast.forecast(layout, spec)
    out["forecast"] = {"seconds": round(time.monotonic() - t, 1), "counts": data["counts"],
                       "lendable": data.get("lendable", 0), "warnings": data["warnings"]}
    log(f"  forecast: {forecast.outcome(data)} ({out['forecast']['seconds']} s)")
    stops, t = [], time.monotonic()
    step = lambda: bump(layout, spec, log=lambda *_: None, run_tests=False, allow_downgrade=True,  # noqa: E731
                        allow_broken_premise=True)
    while True:
        try:
            step()
            break
        except Stopped:
            rec = _stop_record(layout, journal)
            whole = [name for name, c in rec.get("lent", {}).items() if c["resolves"] and not c["not"]]
            rec["action"] = f"take-from {whole[0]}" if whole else "drop"
            stops.append(rec)
            log(f"  stop at {rec['patch']}: {rec['action']}")
            step = (lambda w=whole: bump_continue(layout, take_from=w[0], log=lambda *_: None, run_tests=False)) \
                if whole else (lambda: bump_continue(layout, drop=True, log=lambda *_: None, run_tests=False))
    out["bump"] = {"seconds": round(time.monotonic() - t, 1), "stops": stops}
    record = json.loads(layout.report_json.read_text())
    out["report_counts"] = {k: v for k, v in record["counts"].items() if v}
    changed = set(git(upstream, "diff", "--name-only", state["pin"], state["commit"]).split())
    out["tests"] = run_tests(fork, line, upstream, [s["patch"] for s in stops if s["action"] != "drop"], changed,
                             tests, log)
    return out


def run_tests(fork: Path, line: str, upstream: Path, resolved: list, changed: set, limit: int, log) -> dict:
    """Run the ``Tests:`` most at risk, at most ``limit`` ids: those of the patches whose stop was
    resolved, then of the patches that change a file the new upstream state changed."""
    if limit <= 0:
        return {"ran": 0, "why": "--tests 0"}
    from tools.rebase.git.paths import Layout
    from tools.rebase.stack.seed import files_of_patch
    from tools.rebase.stack.series import parse_patch, read_series

    layout = Layout(fork, line)
    patches = [parse_patch(layout.patches / entry) for entry in read_series(layout.series).names]
    at_risk = [p for p in patches if p.name in resolved] + [
        p for p in patches if p.name not in resolved and files_of_patch(layout.patches, p.name) & changed]
    ids = []
    for patch in at_risk:
        ids += [i for i in patch.tests if i not in ids]
    if not ids:
        return {"ran": 0, "why": "no patch was resolved or touches a file upstream changed"}
    ids = ids[:limit]
    env = dict(os.environ, FORK_REBASE_ALLOW_UNANCHORED_PIN="1", PYTHONPATH=str(fork))  # the fork's megatron/ first
    t = time.monotonic()
    sh(sys.executable, "-m", "tools.rebase", "-C", fork, "apply", "--line", line, "--mirror", upstream, cwd=ROOT, env=env)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ids], cwd=fork,
                          capture_output=True, text=True, env=env)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    summary = next((ln for ln in reversed(lines) if re.search(r"\b(passed|failed|error|errors|no tests ran)\b", ln)),
                   lines[-1] if lines else "")
    log(f"  tests: {summary}")
    return {"patches": [p.name for p in at_risk], "ids": ids, "exit": proc.returncode, "summary": summary,
            "output_tail": lines[-15:], "seconds": round(time.monotonic() - t, 1)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mirror", required=True, help="a local clone of NVIDIA/Megatron-LM (only read)")
    ap.add_argument("--line", default="upstream-dev")
    ap.add_argument("--scenario", action="append", metavar="NAME=BRANCH",
                    help="NAME=BRANCH of the mirror to merge onto the pin (repeatable); default: "
                         + ", ".join(f"{k}={v[0]}" for k, v in SCENARIOS.items()))
    ap.add_argument("--tests", type=int, default=40, help="run at most N Tests: ids of the resolved patches (0: none)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--work", help="scratch folder (default: a new temporary one, removed at the end)")
    args = ap.parse_args(argv)
    os.environ["FORK_REBASE_ALLOW_UNANCHORED_PIN"] = "1"
    scenarios = dict(s.split("=", 1) for s in args.scenario) if args.scenario else \
        {k: v[0] for k, v in SCENARIOS.items()}
    keep = args.work is not None
    work = Path(args.work or tempfile.mkdtemp(prefix="bump-rehearsal-"))
    work.mkdir(parents=True, exist_ok=True)
    upstream = work / "upstream.git"
    os.environ.setdefault("FORK_REBASE_CACHE", str(work / "cache"))  # upstream history fetched once per run
    if not upstream.exists():
        sh("git", "clone", "-q", "--bare", "--shared", args.mirror, upstream)
    results = {}
    try:
        for name, branch in scenarios.items():
            fork = work / f"fork-{name}"
            if not fork.exists():
                sh("git", "clone", "-q", "--shared", ROOT, fork)
            sys.path.insert(0, str(ROOT))
            from tools.rebase.git.paths import Layout
            from tools.rebase.stack.pin import load_pin

            pin = load_pin(Layout(fork, args.line).pin).commit
            print(f"{name}: {branch} onto {pin[:12]}", flush=True)
            t = time.monotonic()
            state = dict(build_state(upstream, pin, branch, name), pin=pin)
            state["seconds"] = round(time.monotonic() - t, 1)
            print(f"  state {state['commit'][:12]}: {state['upstream_commits']} upstream commits, "
                  f"{state['conflicted_files_taken_from_branch']} conflicting files taken from {branch}", flush=True)
            results[name] = rehearse(fork, args.line, upstream, state, args.tests,
                                     lambda m: print(m, flush=True))
    finally:
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
        if not keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
