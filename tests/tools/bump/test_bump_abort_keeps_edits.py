"""Issue 46, item 7: ``bump --abort`` restores from its backup only what the bump may have written.
Edits made by hand while the bump was stopped (README.md, a new file in patches/) would be lost
by the restore: abort refuses, naming them, and changes nothing; the bump's own recorded
resolutions do not count."""

import pytest

from tests.tools.bump.test_bump import STACK, bump_stops, upstream_v2
from tests.tools.bumpkit import make_fork
from tools.rebase.bump.bump import bump_abort
from tools.rebase.errors import RebaseError


@pytest.fixture
def stopped(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork = make_fork(tmp_path)
    (fork.root / "README.md").write_text("# fork\n")
    fork.stack(STACK)
    upstream_v2(fork, conflict=True)
    bump_stops(fork)
    return fork


EDITS = {
    "README.md": lambda root: (root / "README.md").write_text("# fork\n\nnotes written while stopped\n"),
    "patches/0009-new.patch": lambda root: (root / "patches" / "0009-new.patch").write_text("draft\n"),
    "upstream.toml": lambda root: (root / "upstream.toml").write_text((root / "upstream.toml").read_text() + "# x\n"),
}


@pytest.mark.parametrize("name", sorted(EDITS))
def test_abort_refuses_to_overwrite_edits_made_while_stopped(stopped, name):
    EDITS[name](stopped.root)
    edited = (stopped.root / name).read_bytes()
    with pytest.raises(RebaseError, match="would overwrite changes made since the bump started") as err:
        bump_abort(stopped.layout, log=lambda *_a: None)
    assert name in str(err.value)
    assert (stopped.root / name).read_bytes() == edited
    assert (stopped.root / ".rebase" / "bump" / "journal.json").is_file()  # still abortable


def test_abort_goes_ahead_once_the_edits_are_moved_away(stopped):
    readme = (stopped.root / "README.md").read_bytes()
    (stopped.root / "README.md").write_text("edited\n")
    with pytest.raises(RebaseError):
        bump_abort(stopped.layout, log=lambda *_a: None)
    (stopped.root / "README.md").write_bytes(readme)
    recorded = stopped.layout.resolutions / "tweak-beta" / ("0" * 40)
    recorded.mkdir(parents=True)
    (recorded / "preimage").write_text("the bump's own kind of file\n")
    bump_abort(stopped.layout, log=lambda *_a: None)
    assert not (stopped.root / ".rebase" / "bump" / "journal.json").exists()
