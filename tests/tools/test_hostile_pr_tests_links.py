"""Issue 56, item 7: ``check`` reads the files a ``Tests:`` trailer names to find the test in them.
A pull request can commit that file (or a folder on the way) as a link: to ``/dev/zero`` or a FIFO
the read would never end, to a file outside the checkout it would read that. Links anywhere on the
path, anything but a regular file or folder, and files over the size bound are named instead."""

import os
import subprocess

from tests.tools.hostile import committed_fork, pull_request, start_tool


def _check(ci, tmp_path):
    proc = start_tool(ci, "check", cache=tmp_path / "cache")
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError("check did not end: it read a Tests: file through a link") from None
    return proc.returncode, out, err


def test_a_tests_file_linked_to_a_fifo_is_named_not_read(tmp_path):
    fifo = tmp_path / "endless"
    os.mkfifo(fifo)

    def payload(pr):
        (pr / "tests" / "test_dummy.py").unlink()
        (pr / "tests" / "test_dummy.py").symlink_to(fifo)
    ci = pull_request(committed_fork(tmp_path), tmp_path, payload)
    code, out, err = _check(ci, tmp_path)
    assert code != 0, out + err
    assert "Tests: tests/test_dummy.py::test_ok: tests/test_dummy.py is a symlink" in err, err


def test_a_tests_folder_linked_outside_is_named_not_read(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "test_dummy.py").write_text("def test_ok():\n    pass\n")

    def payload(pr):
        for child in (pr / "tests").iterdir():
            child.unlink()
        (pr / "tests").rmdir()
        (pr / "tests").symlink_to(outside)
    ci = pull_request(committed_fork(tmp_path), tmp_path, payload)
    code, out, err = _check(ci, tmp_path)
    assert code != 0, out + err
    assert "Tests: tests/test_dummy.py::test_ok: tests is a symlink" in err, err


def test_a_tests_file_over_the_bound_is_named_not_parsed(tmp_path):
    from tools.rebase.proof.testids import MAX_TEST_FILE_BYTES

    def payload(pr):
        (pr / "tests" / "test_dummy.py").write_text("def test_ok():\n    pass\n" + "#" * MAX_TEST_FILE_BYTES + "\n")
    ci = pull_request(committed_fork(tmp_path), tmp_path, payload)
    code, out, err = _check(ci, tmp_path)
    assert code != 0, out + err
    assert f"Tests: tests/test_dummy.py::test_ok: tests/test_dummy.py: larger than the {MAX_TEST_FILE_BYTES:,} bytes" \
        in err, err
