"""bench/junit_compare.py: one side given as several shard files counts every test of them."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _junit(path, cases):
    body = "".join(
        f'<testcase classname="tests.unit.test_a" name="{name}">{"<failure/>" if failed else ""}</testcase>'
        for name, failed in cases
    )
    path.write_text(f"<testsuites><testsuite>{body}</testsuite></testsuites>")
    return str(path)


def test_shards_of_one_side_are_joined(tmp_path):
    line = ",".join([_junit(tmp_path / "l0.xml", [("x", False)]), _junit(tmp_path / "l1.xml", [("y", True)])])
    dev = _junit(tmp_path / "d.xml", [("x", False), ("y", False)])
    proc = subprocess.run([sys.executable, "bench/junit_compare.py", line, dev], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DIFF tests.unit.test_a::y: fork failed, upstream passed" in proc.stdout
    assert "2 tests (fork), 2 (upstream), 1 differ" in proc.stdout


def test_a_missing_shard_is_named(tmp_path):
    dev = _junit(tmp_path / "d.xml", [("x", False)])
    proc = subprocess.run([sys.executable, "bench/junit_compare.py", f"{dev},{tmp_path}/gone.xml", dev],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "gone.xml: not a junit report" in proc.stderr
