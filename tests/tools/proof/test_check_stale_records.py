"""A contributor's edit needs only apply -> edit -> export -> check: on a scratch copy of the real
stack, a comment changed in a middle patch passes ``check`` (the committed proof record and mutant
scores are then for another stack: a STALE notice, not a failure), and ``--strict-records``, the
maintainer's release-time check, fails on the same copy.

Uses the pinned sdist in $FORK_REBASE_CACHE when present, else downloads it; skips (with the
reason) when neither works.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.tools.bumpkit import quiet
from tools.rebase.cli import main
from tools.rebase.errors import RebaseError
from tools.rebase.git.paths import Layout
from tools.rebase.stack.pin import load_pin
from tools.rebase.stack.series import load_stack
from tools.rebase.stack.source import download_sdist
from tools.rebase.stack.workrepo import apply, export

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def sdist_cache():
    cache = Path(os.environ.get("FORK_REBASE_CACHE") or Path(tempfile.gettempdir()) / "fork-rebase-test-cache")
    pin = load_pin(REPO_ROOT / "upstream.toml")
    try:
        download_sdist(cache, pin.package, pin.version)
    except RebaseError as exc:
        pytest.skip(f"the pinned sdist is not cached in {cache} and cannot be downloaded: {str(exc).splitlines()[0]}")
    return cache


def real_stack_copy(tmp_path, monkeypatch, cache) -> Layout:
    """The checkout's pin, patches (with proof.json), README and tests, in a scratch folder."""
    monkeypatch.setenv("FORK_REBASE_CACHE", str(cache))
    root = tmp_path / "fork"
    root.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("patches", "tests"):
        shutil.copytree(REPO_ROOT / name, root / name, ignore=ignore)
    for name in ("upstream.toml", "README.md"):
        shutil.copyfile(REPO_ROOT / name, root / name)
    return Layout(root)


def middle_comment(layout):
    """(patch file, an added comment line of it that no later patch quotes) of a middle patch."""
    _, patches = load_stack(layout)
    for index in range(len(patches) // 2, len(patches) - 1):
        later = "".join(p.path.read_text() for p in patches[index + 1:])
        for line in patches[index].path.read_text().splitlines():
            if line.startswith("+") and line.lstrip("+ ").startswith("# ") and line[1:] not in later:
                return patches[index].path, line
    pytest.skip("no middle patch adds a comment that later patches do not quote")


def test_editing_a_comment_in_a_middle_patch_passes_check_without_re_proving(tmp_path, monkeypatch, sdist_cache,
                                                                            capsys):
    layout = real_stack_copy(tmp_path, monkeypatch, sdist_cache)
    if not (layout.patches / "proof.json").is_file():
        pytest.skip("the checkout has no proof record to go stale")
    apply(layout, log=quiet)
    root = str(layout.root)
    # The committed records may already be another stack's (a patch's trailer changed since the last
    # prove --record): the edit below must then leave check exactly as green, STALE notice and all.
    main(["-C", root, "check", "--strict-records"])
    capsys.readouterr()

    path, line = middle_comment(layout)
    path.write_text(path.read_text().replace(line + "\n", line + " (reworded)\n", 1))
    apply(layout, log=quiet)  # the edited patch file is now the work repo's commit
    export(layout, log=quiet)
    assert line + " (reworded)" in path.read_text()

    assert main(["-C", root, "check"]) == 0
    out = capsys.readouterr().out
    assert "STALE: patches/proof.json: recorded for another stack" in out
    assert "refresh it with python -m tools.rebase prove --record" in out
    assert "check: the STALE records are for another stack, which is not a failure" in out
    assert "CI re-proves the stack with `prove`" in out
    assert "check: ok" in out.splitlines()

    assert main(["-C", root, "check", "--strict-records"]) == 1
    err = capsys.readouterr().err
    assert "recorded for another stack" in err and "(--strict-records)" in err


def test_edit_a_comment_of_a_middle_patch_in_the_work_repo_then_check(tmp_path, monkeypatch, sdist_cache, capsys):
    """The maintainer's flow from the README: apply, change the line in .rebase/work, `edit PATCH`
    (fold it in and export), check: exit 0 with the STALE notice, nothing re-proven."""
    layout = real_stack_copy(tmp_path, monkeypatch, sdist_cache)
    apply(layout, log=quiet)
    path, line = middle_comment(layout)
    text = path.read_text()
    file = text[:text.index(line + "\n")].rsplit("\n+++ b/", 1)[1].split("\n", 1)[0]
    source = layout.work / file
    source.write_text(source.read_text().replace(line[1:] + "\n", line[1:] + " (reworded)\n", 1))
    root = str(layout.root)
    assert main(["-C", root, "edit", path.name[:4]]) == 0
    assert line + " (reworded)" in path.read_text()
    capsys.readouterr()
    assert main(["-C", root, "check"]) == 0
    out = capsys.readouterr().out
    if (layout.patches / "proof.json").is_file():
        assert "STALE: patches/proof.json: recorded for another stack" in out
    assert "check: ok" in out.splitlines()
