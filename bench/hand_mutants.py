"""Hand-written mutants of the patch stack, run against each patch's own ``Tests:``.

The tool's seeded mutants (``python -m tools.rebase prove --mutants N``) flip operators and
delete statements; these are the plausible bugs a reviewer would write into the code a patch
adds (a dropped cast, a branch taken on the wrong path, a check that accepts too much). Each
mutant in the data file (default ``bench/mutants/hand.toml``) names its patch, a file of the
materialized tree, an exact text that occurs once there and its replacement. For each patch the
script builds the stack up to it (``python -m tools.rebase tree DIR --upto PATCH``), checks that
the unmutated tree passes the patch's ``Tests:``, then applies each mutant alone, runs the
``Tests:`` (stopping at the first failure) in an interpreter that imports that tree only, and
puts the file back. A mutant is killed when the tests fail; a survivor counts as equivalent only
with an ``equivalent`` reason in the data file.

    python -m bench hand_mutants [--patches 0036 0038 ...] [--data FILE] [--scratch DIR]
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.rebase.proof.isolation import isolated_env  # noqa: E402
from tools.rebase.stack.series import parse_patch, read_series  # noqa: E402

_RUN_COPIES = ("tests", "tools", "pytest.ini", "upstream.toml")
_FIELDS = {"patch", "id", "file", "old", "new", "why", "equivalent"}


def load_mutants(path: Path) -> list:
    """The ``[[mutant]]`` tables of ``path``, each checked for its fields."""
    mutants = tomllib.loads(path.read_text()).get("mutant", [])
    seen = set()
    for number, mutant in enumerate(mutants, 1):
        where = f"{path}: mutant #{number} ({mutant.get('id', 'no id')})"
        missing = {"patch", "id", "file", "old", "new", "why"} - set(mutant)
        if missing or set(mutant) - _FIELDS:
            raise SystemExit(f"{where}: missing {sorted(missing)}, unknown {sorted(set(mutant) - _FIELDS)}")
        if mutant["id"] in seen:
            raise SystemExit(f"{where}: the id is used twice")
        if mutant["old"] == mutant["new"]:
            raise SystemExit(f"{where}: old and new text are the same")
        if not mutant["file"].startswith("megatron/") or ".." in Path(mutant["file"]).parts:
            raise SystemExit(f"{where}: file must be a path under megatron/, got {mutant['file']!r}")
        seen.add(mutant["id"])
    return mutants


def patch_file(number: str) -> Path:
    """The series entry whose number (``0036``) or Patch-Name is ``number``."""
    for entry in read_series(ROOT / "patches" / "series").entries:
        path = ROOT / "patches" / entry.name
        if entry.name.startswith(number + "-") or parse_patch(path).name == number:
            return path
    raise SystemExit(f"no patch numbered or named {number!r} in patches/series")


def build_run_dir(patch: Path, run: Path) -> None:
    """The stack up to ``patch`` in ``run``/megatron, with the checkout's tests and tool beside it."""
    for _ in range(60):  # another tools.rebase command holding the checkout's lock: wait for it
        proc = subprocess.run(
            [sys.executable, "-m", "tools.rebase", "tree", str(run), "--upto", patch.name],
            cwd=ROOT, capture_output=True, text=True,
        )
        if proc.returncode == 0 or "another tools.rebase command is running" not in proc.stderr:
            break
        shutil.rmtree(run / "megatron", ignore_errors=True)
        time.sleep(30)
    if proc.returncode != 0:
        raise SystemExit(f"tree --upto {patch.name} failed:\n{proc.stdout}{proc.stderr}")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in _RUN_COPIES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, run / name, ignore=ignore, symlinks=True)
        else:
            shutil.copy2(src, run / name)
    cache = ROOT / ".rebase" / "cache"
    if cache.is_dir():  # the upstream oracle's pinned sdist
        (run / ".rebase").mkdir()
        (run / ".rebase" / "cache").symlink_to(cache.resolve(), target_is_directory=True)


def run_tests(run: Path, shim: Path, node_ids: list) -> subprocess.CompletedProcess:
    env = isolated_env(run, shim)
    env.pop("FORK_REBASE_CACHE", None)  # the run directory's own .rebase/cache link
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--rootdir", str(run),
         "--", *node_ids],
        cwd=run, env=env, capture_output=True, text=True,
    )


def _first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line[:200]
    return output.strip().splitlines()[-1][:200] if output.strip() else ""


def _check_applies(run: Path, patch: Path, mutant: dict) -> str:
    """The file's text; refuses a mutant whose old text is not there exactly once."""
    target = run / mutant["file"]
    original = target.read_text() if target.is_file() else ""
    count = original.count(mutant["old"])
    if count != 1:
        raise SystemExit(f"{mutant['id']}: the old text occurs {count} times in {mutant['file']} "
                         f"of the tree up to {patch.name} (must be once)")
    return original


def run_patch(number: str, mutants: list, scratch: Path, check_only: bool = False) -> list:
    """Every mutant of one patch against its Tests:; returns one result dict per mutant."""
    patch = patch_file(number)
    tests = parse_patch(patch).tests
    run = scratch / number
    build_run_dir(patch, run)
    if check_only:
        for mutant in mutants:
            _check_applies(run, patch, mutant)
        print(f"{number}: {len(mutants)} mutants apply", flush=True)
        return []
    baseline = run_tests(run, scratch / "isolation", tests)
    if baseline.returncode != 0:
        raise SystemExit(f"{patch.name}: its Tests: fail on the unmutated tree:\n{baseline.stdout[-3000:]}")
    results = []
    for mutant in mutants:
        target = run / mutant["file"]
        original = _check_applies(run, patch, mutant)
        target.write_text(original.replace(mutant["old"], mutant["new"]))
        start = time.monotonic()
        try:
            proc = run_tests(run, scratch / "isolation", tests)
        finally:
            target.write_text(original)
        killed = proc.returncode != 0
        verdict = "killed" if killed else ("equivalent" if mutant.get("equivalent") else "survived")
        result = {"patch": number, "id": mutant["id"], "verdict": verdict, "why": mutant["why"],
                  "seconds": round(time.monotonic() - start, 1),
                  "by": _first_failure(proc.stdout) if killed else mutant.get("equivalent", "")}
        print(f"{number}  {mutant['id']:<40} {verdict:<10} {result['by']}", flush=True)
        results.append(result)
    return results


def summary(results: list) -> list:
    """One line per patch: killed / non-equivalent mutants and the score."""
    lines = []
    for number in sorted({r["patch"] for r in results}):
        mine = [r for r in results if r["patch"] == number]
        killed = sum(r["verdict"] == "killed" for r in mine)
        counted = sum(r["verdict"] != "equivalent" for r in mine)
        score = 100.0 * killed / counted if counted else 100.0
        equivalent = len(mine) - counted
        lines.append(f"{number}: {killed}/{counted} killed ({score:.0f}%), {equivalent} equivalent")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT / "bench" / "mutants" / "hand.toml")
    parser.add_argument("--patches", nargs="*", help="patch numbers or names (default: all in the data)")
    parser.add_argument("--scratch", type=Path, help="an empty directory for the trees (default: a temporary one)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--ids", nargs="*", help="only these mutant ids")
    parser.add_argument("--check", action="store_true",
                        help="only check that every mutant applies to its tree (no tests run)")
    args = parser.parse_args(argv)
    mutants = load_mutants(args.data)
    if args.ids:
        unknown_ids = set(args.ids) - {m["id"] for m in mutants}
        if unknown_ids:
            raise SystemExit(f"no mutant with id {sorted(unknown_ids)} in {args.data}")
        mutants = [m for m in mutants if m["id"] in args.ids]
    numbers = args.patches or sorted({m["patch"] for m in mutants})
    unknown = set(numbers) - {m["patch"] for m in mutants}
    if unknown:
        raise SystemExit(f"no mutants for {sorted(unknown)} in {args.data}")
    with tempfile.TemporaryDirectory(prefix="hand-mutants-") as tmp:
        scratch = args.scratch or Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        if any(scratch.iterdir()):
            raise SystemExit(f"--scratch {scratch} is not empty")
        results = []
        for number in numbers:
            results += run_patch(number, [m for m in mutants if m["patch"] == number], scratch,
                                 check_only=args.check)
            if args.json and not args.check:  # after each patch: a long run stopped keeps its part
                args.json.write_text(json.dumps({"results": results, "summary": summary(results)},
                                                indent=1) + "\n")
    if args.check:
        return 0
    lines = summary(results)
    print("\n".join(lines))
    survived = [r["id"] for r in results if r["verdict"] == "survived"]
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
