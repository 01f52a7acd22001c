"""``bump --abort`` copies the bump's backup over the pin, ``patches/`` and the work repo's config,
so it restores only from a backup the tool made in this checkout (``git/owned.py``): one an archive
of a stopped bump carried (a tarball of a pull request) is refused naming it, and nothing is restored."""

import pytest

from tests.tools.bump.test_bump import STACK, bump_stops, upstream_v2
from tests.tools.bumpkit import make_fork
from tests.tools.hostile import unpacked_archive
from tools.rebase.bump.bump import bump_abort
from tools.rebase.errors import RebaseError
from tools.rebase.git.paths import Layout


def test_a_bump_backup_unpacked_from_an_archive_is_refused_and_nothing_is_restored(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork, conflict=True)
    bump_stops(fork)  # a genuine backup, with its marker
    backup = fork.root / ".rebase" / "bump" / "backup"
    (backup / "upstream.toml").write_text('[upstream]\nkind = "git"\nurl = "/evil"\n')
    (backup / "work-config").write_text(f"[core]\n\tworktree = {tmp_path / 'site-packages'}\n")
    unpacked = unpacked_archive(tmp_path, fork.root, keep=lambda rel: rel.parts[1] == "bump")
    pin = (unpacked / "upstream.toml").read_bytes()
    with pytest.raises(RebaseError, match=r"\.rebase/bump/backup: not a bump's backup made here by tools.rebase"):
        bump_abort(Layout(unpacked), log=lambda *_a: None)
    assert (unpacked / "upstream.toml").read_bytes() == pin
    assert (unpacked / ".rebase" / "bump" / "journal.json").is_file()


def test_the_tools_own_backup_restores_as_before(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork, conflict=True)
    pin = fork.layout.pin.read_bytes()
    bump_stops(fork)
    bump_abort(fork.layout, log=lambda *_a: None)
    assert fork.layout.pin.read_bytes() == pin
