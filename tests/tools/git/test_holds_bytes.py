"""``holds_bytes``: the recordings' "already written?" check reads nothing through a link or a FIFO
(a pull request can commit either under ``patches/resolutions/`` or ``.rebase/``), and says "no"
so the caller's link-refusing write names the path instead."""

import os

from tools.rebase.git.safefs import holds_bytes


def test_a_plain_file_with_the_bytes_holds_them(tmp_path):
    (tmp_path / "f").write_bytes(b"image\n")
    assert holds_bytes(tmp_path / "f", b"image\n")
    assert not holds_bytes(tmp_path / "f", b"other\n")
    assert not holds_bytes(tmp_path / "missing", b"image\n")


def test_a_link_to_the_same_bytes_is_not_read_through(tmp_path):
    (tmp_path / "outside").write_bytes(b"image\n")
    os.symlink(tmp_path / "outside", tmp_path / "link")
    assert not holds_bytes(tmp_path / "link", b"image\n")


def test_a_fifo_does_not_block(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    assert not holds_bytes(tmp_path / "fifo", b"image\n")


def test_a_longer_file_is_not_read_whole(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 10_000)
    assert not holds_bytes(tmp_path / "big", b"x" * 10)
