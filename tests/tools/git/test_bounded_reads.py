"""Issue 56, the class review of reads from a checkout: the pin, the series and the patch files
are read as regular files only, never through a link, without blocking on a FIFO (an unpacked
archive can carry one), and never more than the tool's bound per file."""

import os
import subprocess
import sys

import pytest

from tests.tools.hostile import REPO_ROOT

READERS = {
    "pin": "from tools.rebase.stack.pin import load_pin as read",
    "series": "from tools.rebase.stack.series import read_series as read",
    "patch": "from tools.rebase.stack.series import parse_patch as read",
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_fifo_in_place_of_a_checkout_file_is_an_error_not_a_hang(tmp_path, reader):
    fifo = tmp_path / "0001-x.patch"
    os.mkfifo(fifo)
    code = f"import sys, pathlib; {READERS[reader]}\nread(pathlib.Path(sys.argv[1]))"
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(fifo)], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the {reader} reader blocked on a FIFO") from None
    assert "not a regular file" in proc.stderr or "is missing" in proc.stderr, proc.stderr


def test_a_file_over_the_bound_is_refused_before_it_is_read(tmp_path):
    from tools.rebase.errors import RebaseError
    from tools.rebase.git.safefs import read_nofollow

    path = tmp_path / "big"
    path.write_bytes(b"x" * 11)
    assert read_nofollow(path, limit=11) == b"x" * 11
    with pytest.raises(RebaseError, match=r"big: larger than the 10 bytes the tool reads from one file"):
        read_nofollow(path, limit=10)
