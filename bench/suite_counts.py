"""The test-suite figures the README states, counted by pytest's own collection.

    python bench/suite_counts.py          # one collection of tests/ (about 40 s on 2 cores)

Prints how many tests ``python -m pytest tests`` runs, how many the fast subset
(``-m "not slow"``) leaves out, and how many need a GPU (skipped without CUDA). The collection
runs in a child pytest with this module as its plugin (``-p bench.suite_counts``): the marks are
read from each collected item, as ``-m`` reads them, in one pass instead of two.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_LINE = re.compile(r"^test-counts: total=(\d+) slow=(\d+) gpu=(\d+)$", re.M)


def pytest_collection_finish(session):
    """Plugin hook in the child: one line with the counts of what this run would execute."""
    items = session.items
    slow = sum("slow" in item.keywords for item in items)
    gpu = sum("gpu" in item.keywords for item in items)
    session.config.get_terminal_writer().line(f"test-counts: total={len(items)} slow={slow} gpu={gpu}")


def counts(root: Path = ROOT) -> dict:
    """``{"total", "slow", "fast", "gpu"}`` of ``python -m pytest tests`` in ``root``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests", "--collect-only", "-q", "-p", "bench.suite_counts"],
                          cwd=root, env=env, capture_output=True, text=True)
    m = _LINE.search(proc.stdout)
    if proc.returncode != 0 or m is None:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        raise RuntimeError(f"pytest --collect-only in {root} failed (exit {proc.returncode}): " + " | ".join(tail))
    total, slow, gpu = (int(g) for g in m.groups())
    return {"total": total, "slow": slow, "fast": total - slow, "gpu": gpu}


def main() -> int:
    try:
        found = counts()
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"python -m pytest tests: {found['total']} tests ({found['gpu']} need a GPU and skip without CUDA)")
    print(f'python -m pytest tests -m "not slow": {found["fast"]} tests; {found["slow"]} marked slow left out')
    return 0


if __name__ == "__main__":
    sys.exit(main())
