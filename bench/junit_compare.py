"""Compare two pytest junit-xml runs of the same test files (the fork's and pristine upstream's).

Used on the GPU machine for upstream's own unit tests with Transformer Engine: the fork must give
the same pass/fail verdict as upstream on every test, so the table lists counts per file and then
every test whose outcome differs between the two runs.
Usage: python3 bench/junit_compare.py fork.xml upstream.xml
A side run in several pytest processes (shards) is given as its files joined by commas:
fork-0.xml,fork-1.xml.
"""

import collections
import sys
import xml.etree.ElementTree as ET


def outcomes(paths):
    """{test id: outcome} of one side's junit files (comma-separated); a missing or truncated file
    is an error naming it."""
    result = {}
    for path in paths.split(","):
        result.update(_outcomes(path))
    return result


def _outcomes(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        sys.exit(f"{path}: not a junit report ({exc})")
    result = {}
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            result[test_id] = "failed"
        elif "error" in kinds:
            result[test_id] = "error"
        elif "skipped" in kinds:
            result[test_id] = "skipped"
        else:
            result[test_id] = "passed"
    return result


def per_file(results):
    counts = collections.defaultdict(collections.Counter)
    for test_id, outcome in results.items():
        parts = test_id.split("::", 1)[0].split(".")
        modules = [i for i, part in enumerate(parts) if part.startswith("test_")]
        module = ".".join(parts[: modules[-1] + 1]) if modules else ".".join(parts)
        counts[module][outcome] += 1
    return counts


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    fork, upstream = outcomes(argv[1]), outcomes(argv[2])
    fork_counts, upstream_counts = per_file(fork), per_file(upstream)
    kinds = ("passed", "failed", "error", "skipped")
    print(f"{'module':60} " + " ".join(f"{k:>15}" for k in kinds))
    for module in sorted(set(fork_counts) | set(upstream_counts)):
        cells = [f"{fork_counts[module][k]}/{upstream_counts[module][k]}" for k in kinds]
        print(f"{module[-60:]:60} " + " ".join(f"{c:>15}" for c in cells))
    print("(cells: fork/upstream)")
    differing = sorted(t for t in set(fork) | set(upstream) if fork.get(t) != upstream.get(t))
    for test_id in differing:
        print(f"DIFF {test_id}: fork {fork.get(test_id, 'absent')}, upstream {upstream.get(test_id, 'absent')}")
    print(f"{len(fork)} tests (fork), {len(upstream)} (upstream), {len(differing)} differ")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
