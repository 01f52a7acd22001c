"""``python -m bench`` is the one entry point of the maintained benchmarks (issue 47): it lists
them, runs one with its arguments, and refuses an unknown name; every script in bench/ is either a
listed benchmark or a named helper, so a new one cannot be left out of the list."""

import subprocess
import sys
from pathlib import Path

from bench.__main__ import BENCHMARKS, HELPERS

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def run(*args):
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_every_script_is_a_listed_benchmark_or_a_helper():
    scripts = {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh")}
    listed = {file for file, _, _ in BENCHMARKS.values()}
    assert listed <= scripts, listed - scripts
    assert scripts - listed - HELPERS == set(), "add them to BENCHMARKS or HELPERS in bench/__main__.py"
    assert not listed & HELPERS


def test_the_listing_names_every_benchmark_and_the_readme_does_too():
    out = run()
    assert out.returncode == 0, out.stderr
    readme = (BENCH / "README.md").read_text()
    for name in BENCHMARKS:
        assert f"\n  {name} " in out.stdout, name
        assert f"`{name}`" in readme, f"bench/README.md does not describe {name}"


def test_an_unknown_name_is_refused_with_the_list():
    out = run("no_such_bench")
    assert out.returncode == 2
    assert "no benchmark named 'no_such_bench'" in out.stderr and "rebase_bench" in out.stderr


def test_a_benchmark_gets_its_arguments():
    out = run("report_bench", "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: report_bench.py") and "--repeat" in out.stdout
    bad = run("report_bench", "--no-such-option")
    assert bad.returncode == 2 and "unrecognized arguments: --no-such-option" in bad.stderr
