"""A read-only checkout (CI mounting the pull request read-only, or a folder of another user): the
tool refuses with an error naming the path it cannot write, before it changes anything; a command
that does not write there (``check`` and ``megatron/``) still runs.

Root writes through any permission bits, so as root the tool runs with the capabilities that allow
that (``CAP_DAC_OVERRIDE`` and friends) dropped: the permission bits then bind it like any user."""

import os
import shutil
import stat
from pathlib import Path

import pytest

from tests.tools.hostile import committed_fork, pull_request, tool

_NO_OVERRIDE = ("setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--")


@pytest.fixture
def runner():
    if os.getuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot take root's power to write read-only folders")
    return _NO_OVERRIDE


def _set_writable(root: Path, paths, writable: bool):
    for top in paths:
        for folder in [top, *(p for p in top.rglob("*") if p.is_dir() and not p.is_symlink())]:
            mode = folder.stat().st_mode
            folder.chmod(mode | stat.S_IWUSR if writable else mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): (p.lstat().st_mode, p.lstat().st_size, p.lstat().st_mtime_ns)
            for p in [root, *root.rglob("*")]}


@pytest.fixture
def checkout(tmp_path):
    ci = pull_request(committed_fork(tmp_path), tmp_path, lambda pr: None)
    locked = []
    yield ci, locked
    _set_writable(ci, locked, True)


@pytest.mark.parametrize("command", ["apply", "check", "export"])
def test_a_read_only_checkout_is_refused_naming_it_and_left_unchanged(tmp_path, checkout, runner, command):
    ci, locked = checkout
    locked.append(ci)
    _set_writable(ci, [ci], False)
    before = _snapshot(ci)
    proc = tool(ci, command, cache=tmp_path / "cache", runner=runner)
    assert proc.returncode != 0
    assert f"{ci}: not writable by this user" in proc.stderr and "nothing was changed" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert _snapshot(ci) == before


def test_an_applied_checkout_made_read_only_is_refused_naming_its_state_folder(tmp_path, checkout, runner):
    ci, locked = checkout
    assert tool(ci, "apply", cache=tmp_path / "cache").returncode == 0
    locked.append(ci)
    _set_writable(ci, [ci], False)
    before = _snapshot(ci)
    for command in ("apply", "check"):  # even an apply with nothing to do: it takes the lock
        proc = tool(ci, command, cache=tmp_path / "cache", runner=runner)
        assert proc.returncode != 0 and f"{ci / '.rebase'}: not writable by this user" in proc.stderr, proc.stderr
        assert "MEGATRON_FORK_SKIP_APPLY=1" in proc.stderr
    assert _snapshot(ci) == before


def test_a_read_only_megatron_folder_refuses_apply_but_not_check(tmp_path, checkout, runner):
    ci, locked = checkout
    assert tool(ci, "apply", cache=tmp_path / "cache").returncode == 0
    (ci / "patches" / "0001-keep-alpha.patch").write_text(
        (ci / "patches" / "0001-keep-alpha.patch").read_text().replace("Why it exists.", "Why, again."))
    locked.append(ci / "megatron")
    _set_writable(ci, [ci / "megatron"], False)
    before = _snapshot(ci / "megatron")
    proc = tool(ci, "apply", cache=tmp_path / "cache", runner=runner)
    assert proc.returncode != 0 and f"{ci / 'megatron'}: not writable by this user" in proc.stderr, proc.stderr
    assert _snapshot(ci / "megatron") == before
    proc = tool(ci, "check", cache=tmp_path / "cache", runner=runner)
    assert "pin ok" in proc.stdout and "not writable" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
