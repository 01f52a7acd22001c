"""The work repos (``.rebase/work``, a line's ``.rebase/lines/<name>/work``) and cache repos are the
tool's only when it made them there: a marker bound to a stamp file's inode and change time. One
without it (left by something else), or one that came in an archive of a checkout (a tarball of a
pull request has no git index to refuse it by, and can carry a genuine marker), is refused with an
error naming it before any git command runs in it, so its config (``core.worktree``) never acts."""

import os
from pathlib import Path

import pytest

from tests.tools.bumpkit import add_line, sh
from tests.tools.hostile import committed_fork, pull_request, tool, unpacked_archive
from tools.rebase.errors import RebaseError
from tools.rebase.git.owned import is_marked, mark, refuse_unmarked

_REFUSED = "not a work repo made here by tools.rebase"


def _aim_worktree_at(git_dir: Path, victim: Path):
    """The attack: a work repo whose own config makes git check out into ``victim``."""
    victim.mkdir(exist_ok=True)
    with open(git_dir / "config", "a") as fh:
        fh.write(f"[core]\n\tworktree = {victim}\n")


def test_a_work_repo_the_tool_did_not_make_is_refused_naming_it_before_git_runs_in_it(tmp_path):
    ci = pull_request(committed_fork(tmp_path), tmp_path, lambda pr: None)
    work = ci / ".rebase" / "work"
    work.mkdir(parents=True)
    sh("git", "init", "-q", str(work), cwd=tmp_path)  # left by something else: no marker
    _aim_worktree_at(work / ".git", tmp_path / "site-packages")
    config = (work / ".git" / "config").read_bytes()
    for command in ("apply", "check", "export"):
        proc = tool(ci, command, cache=tmp_path / "cache")
        assert proc.returncode != 0 and f"{work / '.git'}: {_REFUSED}" in proc.stderr, (command, proc.stderr)
        assert "remove .rebase/work" in proc.stderr
    assert list((tmp_path / "site-packages").iterdir()) == []
    assert (work / ".git" / "config").read_bytes() == config and not (work / ".git" / "index").exists()


def test_a_lines_unmarked_work_repo_is_refused_and_the_release_lines_own_is_made_with_a_marker(fork, tmp_path):
    from tools.rebase.git.owned import WORK_MARKER, WORK_PURPOSE
    from tools.rebase.git.paths import layout

    fork.stack([])  # apply: the tool makes the release line's work repo
    assert is_marked(fork.work / ".git", WORK_MARKER, WORK_PURPOSE)
    add_line(fork, "next")
    work = fork.root / ".rebase" / "lines" / "next" / "work"
    sh("git", "init", "-q", str(work), cwd=tmp_path)
    with pytest.raises(RebaseError, match=f"{work / '.git'}: {_REFUSED}.*remove .rebase/lines/next/work"):
        layout(fork.root, line="next")


def test_a_tarball_carrying_a_genuinely_marked_work_repo_is_refused_and_its_config_never_acts(tmp_path):
    ci = pull_request(committed_fork(tmp_path), tmp_path, lambda pr: None)
    assert tool(ci, "apply", cache=tmp_path / "cache").returncode == 0  # the tool's own, with its marker
    victim = tmp_path / "site-packages"
    _aim_worktree_at(ci / ".rebase" / "work" / ".git", victim)
    (ci / "patches" / "0001-keep-alpha.patch").write_text(  # so apply would check the new stack out
        (ci / "patches" / "0001-keep-alpha.patch").read_text().replace("Why it exists.", "Why, again."))
    checkout = unpacked_archive(tmp_path, ci, keep=lambda rel: rel.parts[1] in ("work", "state.json"))
    assert not (checkout / ".git").exists() and (checkout / ".rebase" / "work" / ".git" / "megatron-rebase-work").is_file()
    for command in ("apply", "check", "export"):
        proc = tool(checkout, command, cache=tmp_path / "cache")
        assert proc.returncode != 0, (command, proc.stdout)
        assert f"{checkout / '.rebase' / 'work' / '.git'}: {_REFUSED}" in proc.stderr, (command, proc.stderr)
    assert list(victim.iterdir()) == []


def test_a_tarball_carrying_a_genuinely_marked_cache_repo_is_refused(tmp_path):
    ci = pull_request(committed_fork(tmp_path), tmp_path, lambda pr: None)
    assert tool(ci, "apply").returncode == 0  # the default cache: .rebase/cache in the checkout
    (mirror,) = (ci / ".rebase" / "cache" / "git").glob("*.git")
    checkout = unpacked_archive(tmp_path, ci, keep=lambda rel: rel.parts[1] == "cache")
    proc = tool(checkout, "check")
    assert proc.returncode != 0
    carried = checkout / ".rebase" / "cache" / "git" / mirror.name
    assert f"{carried}: this cache repository was not created by tools.rebase" in proc.stderr, proc.stderr


def test_a_copied_marker_or_one_of_another_user_does_not_count(tmp_path):
    made, copy = tmp_path / "made", tmp_path / "copy"
    made.mkdir()
    copy.mkdir()
    mark(made, "marker", "a test repo")
    assert is_marked(made, "marker", "a test repo") and not is_marked(made, "marker", "another purpose")
    for name in ("marker", "marker.stamp"):
        (copy / name).write_bytes((made / name).read_bytes())
    assert not is_marked(copy, "marker", "a test repo")
    with pytest.raises(RebaseError, match=f"{copy}: not a test repo made here by tools.rebase"):
        refuse_unmarked(copy, "marker", "a test repo", "")
    refuse_unmarked(tmp_path / "absent", "marker", "a test repo", "")  # nothing there: nothing to refuse
    if os.getuid() == 0:
        os.chown(made / "marker", 12345, -1)
        assert not is_marked(made, "marker", "a test repo")
