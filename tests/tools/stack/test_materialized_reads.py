"""Issue 56, the class review of reads from a checkout: ``megatron/`` is never committed, but an
unpacked archive can carry one. Hashing it to find hand edits (before ``apply`` replaces it) never
blocks on a FIFO there, and its manifest is read only as a bounded regular file, never through a
link."""

import os
import subprocess
import sys

from tests.tools.hostile import REPO_ROOT

CODE = ("import sys, pathlib\nfrom tools.rebase.stack.materialize import local_edits\n"
        "print(local_edits(pathlib.Path(sys.argv[1])))")


def _local_edits(target):
    try:
        proc = subprocess.run([sys.executable, "-c", CODE, str(target)], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("hashing megatron/ blocked") from None
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_fifo_in_the_materialized_tree_is_reported_not_read(tmp_path):
    target = tmp_path / "megatron"
    (target / "core").mkdir(parents=True)
    (target / "core" / "a.py").write_text("x = 1\n")
    (target / ".fork-manifest.json").write_text('{"core/a.py": "0"}')
    os.mkfifo(target / "core" / "pipe.py")
    out = _local_edits(target)
    assert "core/a.py" in out and "core/pipe.py" in out, out


def test_a_manifest_linked_outside_is_not_read_through(tmp_path):
    target = tmp_path / "megatron"
    target.mkdir()
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (target / ".fork-manifest.json").symlink_to(outside)
    out = _local_edits(target)
    assert "is corrupt" in out and "symlink" in out, out
