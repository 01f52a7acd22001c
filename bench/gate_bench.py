"""Benchmark (not a test): the time of a bump's finishing gate on a line's stack.

The gate (``tools/rebase/bump/resolved_tests.py``) runs every patch's ``Tests:`` on the whole
stack in ``--jobs`` pytest processes and keeps the results keyed by the stack's tree. This runs
exactly that code on the stack ``apply`` materializes (the line's pinned base + its series, the
stack a bump that changed nothing would finish with): once cold (the line's entries of the
result cache removed first) and once more, which reuses every result.

    python bench/gate_bench.py [--line NAME] [--jobs 2] [--mirror PATH]

Writes ``megatron/`` (``apply``) and the result cache in ``$FORK_REBASE_CACHE``; nothing else.
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.rebase.bump.resolved_tests import _tested_pin, run_gate_tests  # noqa: E402
from tools.rebase.git.gitcmd import git  # noqa: E402
from tools.rebase.git.paths import Layout  # noqa: E402
from tools.rebase.proof.testcache import TestResults  # noqa: E402
from tools.rebase.stack.series import load_stack  # noqa: E402
from tools.rebase.stack.state import read_state  # noqa: E402
from tools.rebase.stack.workrepo import apply  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--line", help="a line of lines/ (default: the release line)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--mirror", help="a local clone of a git pin's URL (as apply --mirror)")
    args = parser.parse_args(argv)
    layout = Layout(ROOT, args.line)
    if args.mirror:
        from tools.rebase.stack.pin import load_pin
        from tools.rebase.stack.gitsource import use_mirror

        use_mirror(load_pin(layout.pin).url, args.mirror)
    apply(layout, log=lambda *_: None)
    tip = read_state(layout)["tip"]
    tree = git("rev-parse", f"{tip}^{{tree}}", cwd=layout.work).strip()
    _, patches = load_stack(layout)
    tests = {p.name: p.tests for p in patches if p.tests}
    pin = layout.pin.read_text()
    wanted = [t for ids in tests.values() for t in ids]
    TestResults(layout, tree, pin).forget(wanted)  # the cold run
    figures = []
    for label in ("cold", "reused"):
        began = time.monotonic()
        with _tested_pin(pin):
            results = run_gate_tests(layout, tree, pin, tests, args.jobs, log=lambda *_: None)
        seconds = time.monotonic() - began
        outcomes = [o for r in results.values() for o in r.values()]
        bad = [f"{name}: {t}: {o}" for name, r in results.items() for t, o in r.items()
               if o not in ("passed", "skipped")]
        figures.append((label, seconds, len(outcomes), len(bad)))
        for line in bad[:20]:
            print(f"  {label}: {line}")
    print(f"gate on {args.line or 'the release line'}: {len(tests)} patches, {len(set(wanted))} Tests: ids, "
          f"--jobs {args.jobs}")
    for label, seconds, count, bad in figures:
        print(f"  {label}: {seconds:.0f} s, {count} outcomes, {bad} not passed or skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
