"""tests/run_gpu_suite.sh: what it runs (checked with GPU_SUITE_DRY=1, which needs no GPU)."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def dry_run(**env):
    full = {**os.environ, "PYTHON": sys.executable, "GPU_SUITE_DRY": "1", **env}
    return subprocess.run(["bash", str(ROOT / "tests" / "run_gpu_suite.sh"), "-n", "4"], env=full,
                          capture_output=True, text=True, timeout=120)


def test_default_runs_the_gpu_marked_tests():
    proc = dry_run()
    assert proc.returncode == 0, proc.stderr
    args = shlex.split(proc.stdout)
    assert args[args.index("-m", 2):][:2] == ["-m", "gpu"], args
    assert "tests" in args and args[-2:] == ["-n", "4"], args


def test_a_line_runs_every_test_of_its_tests_files_and_the_integration_tests():
    proc = dry_run(GPU_SUITE_PATCHES="lines/upstream-dev/patches")
    assert proc.returncode == 0, proc.stderr
    args = shlex.split(proc.stdout)
    paths = [a for a in args if a.startswith("tests/")]
    assert "gpu" not in args, "a line's suite is every test, not only the gpu-marked ones"
    # a dev-line-only Tests: file, a file every line names, and the integration tests
    for expected in ("tests/unit_tests/fusions/test_fused_mhc_fork_kernels.py",
                     "tests/unit_tests/optimizer/cpu_offloading/test_hybrid_optimizer_stream_order.py",
                     "tests/integration"):
        assert expected in paths, (expected, paths)
    assert len(paths) == len(set(paths)) > 40
    assert all((ROOT / p).exists() for p in paths), [p for p in paths if not (ROOT / p).exists()]
    release = shlex.split(dry_run(GPU_SUITE_PATCHES="patches").stdout)
    assert "tests/unit_tests/fusions/test_fused_mhc_fork_kernels.py" not in release


def test_a_directory_without_a_series_is_named():
    proc = dry_run(GPU_SUITE_PATCHES="docs")
    assert proc.returncode == 2
    assert "GPU_SUITE_PATCHES=docs: no series file" in proc.stderr


def test_a_tests_trailer_that_is_not_a_test_file_is_refused(tmp_path):
    # A pull request's patch could name anything there; it must not become a pytest option.
    source = ROOT / "patches" / "0047-hybrid-optimizer-device-step-waits-for-d2h.patch"
    text = source.read_text()
    marker = "Tests: tests/unit_tests/optimizer/cpu_offloading/test_hybrid_optimizer_stream_order.py"
    assert marker in text
    (tmp_path / source.name).write_text(text.replace(marker, "Tests: -pevil_plugin::x"))
    (tmp_path / "series").write_text(source.name + "\n")
    proc = dry_run(GPU_SUITE_PATCHES=str(tmp_path))
    assert proc.returncode == 2, proc.stdout
    assert "not a test file under tests/: '-pevil_plugin'" in proc.stderr, proc.stderr
