"""Issue 46, item 6: a recorded resolution is data a pull request can file anywhere under
patches/resolutions/. A rerere recording resolves only the conflicts of the patch it is filed
under (rerere itself matches a conflict by its text alone), and ``--resolutions-from`` loads only
the lender's folders of this stack's patches."""

import shutil

import pytest

from tests.tools.bump.test_bump import STACK, bump_stops, resolve_beta, upstream_v2
from tests.tools.bumpkit import clone_with_resolutions, make_fork, quiet, sh
from tools.rebase.bump.bump import bump, bump_continue
from tools.rebase.errors import RebaseError


def passed(layout, name, ids):
    return {i: "passed" for i in ids}


@pytest.fixture
def resolved(tmp_path, monkeypatch):
    """A fork that bumped onto v2 once, resolving tweak-beta's conflict, and a clone of its old
    stack with the committed resolutions (another machine, about to make the same bump)."""
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork, conflict=True)
    before_pin, before_patches = fork.layout.pin.read_bytes(), fork.patch_files()
    bump_stops(fork)
    resolve_beta(fork, "beta line 5 both")
    bump_continue(fork.layout, log=quiet, test_runner=passed)
    return fork, clone_with_resolutions(tmp_path, fork, before_pin, before_patches, monkeypatch)


def test_a_recording_filed_under_another_patch_resolves_nothing(resolved):
    fork, clone = resolved
    store = clone.layout.resolutions
    (recorded,) = list((store / "tweak-beta").iterdir())
    (store / "keep-alpha").mkdir(exist_ok=True)
    shutil.move(str(recorded), str(store / "keep-alpha" / recorded.name))
    shutil.rmtree(store / "tweak-beta")
    with pytest.raises(RebaseError, match="not tweak-beta's own") as err:
        bump(clone.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=passed)
    assert f"keep-alpha/{recorded.name}" in str(err.value)
    assert "beta line 5 both" not in "".join(t.decode() for t in clone.patch_files().values())


def test_the_stop_names_the_recording_that_resolved_it(resolved):
    fork, clone = resolved
    (recorded,) = list((clone.layout.resolutions / "tweak-beta").iterdir())
    logged = []
    bump(clone.layout, f"git:{fork.upstream}@v2", log=logged.append, test_runner=passed)
    (line,) = [m for m in logged if m.startswith("  tweak-beta: conflict resolved by a recorded resolution")]
    assert line.endswith(f"(patches/resolutions/tweak-beta/{recorded.name})"), line


def test_resolutions_from_takes_only_the_lenders_folder_of_the_same_patch(tmp_path, cache):
    """The lending line's recording of tweak-beta's conflict, filed there under keep-alpha (also a
    patch of this stack), does not resolve tweak-beta's conflict here."""
    from tests.tools.bump.test_bump_lines import fork_with_line_ahead

    fork, line = fork_with_line_ahead(tmp_path)
    lent = line.layout.resolutions
    (recorded,) = list((lent / "tweak-beta").iterdir())
    (lent / "keep-alpha").mkdir()
    shutil.move(str(recorded), str(lent / "keep-alpha" / recorded.name))
    shutil.rmtree(lent / "tweak-beta")
    with pytest.raises(RebaseError, match="not tweak-beta's own") as err:
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, resolutions_from=line.layout, test_runner=passed)
    assert f"lines/ahead/patches/resolutions/keep-alpha/{recorded.name}" in str(err.value)
    assert not (fork.layout.resolutions / "keep-alpha").exists()
