"""A line records the patches it drops (``patches/dropped``), so its refresh does not meet them again.

The defect: the upstream-dev line dropped the patches upstream dev had absorbed, but a refresh
(``seed --line NAME`` copies the release line's series, then ``bump``) brought every one of them
back and stopped on each again. Now ``bump --continue --drop`` on a line writes the drop, the line's
bump drops a recorded patch when the replay reaches it, and ``check`` lints the file; ``seed``
keeps the message of a patch the line reduced."""

import shutil

import pytest

from tests.tools.bumpkit import (
    A,
    B,
    TWO_PATCH_STACK,
    add_line,
    all_tests_pass,
    make_fork,
    quiet,
    replace_line,
    sh,
)
from tools.rebase.bump.bump import Stopped, bump, bump_continue
from tools.rebase.errors import RebaseError
from tools.rebase.proof.check import check_without_base
from tools.rebase.stack.drops import parse_drops, read_drops
from tools.rebase.stack.seed import seed_line
from tools.rebase.stack.series import parse_patch, read_series
from tools.rebase.stack.workrepo import apply

STACK = TWO_PATCH_STACK



no_tests = all_tests_pass


def line_that_dropped_beta(tmp_path):
    """Release line on v1 with both patches; line ``ahead`` bumped onto v2 (which rewrites the line
    tweak-beta changes) and tweak-beta dropped at its stop."""
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 upstream\n")}, "upstream: beta 5")
    sh("git", "tag", "v2", cwd=fork.upstream)
    line = add_line(fork, "ahead")
    shutil.rmtree(line.layout.patches)
    shutil.copytree(fork.layout.patches, line.layout.patches)
    with pytest.raises(Stopped, match="tweak-beta"):
        bump(line.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=no_tests)
    logged = []
    bump_continue(line.layout, drop=True, log=logged.append, test_runner=no_tests)
    assert any("recorded in lines/ahead/patches/dropped" in entry for entry in logged), logged
    return fork, line


def test_a_drop_on_a_line_is_recorded_and_a_refresh_does_not_stop_on_it(tmp_path, cache):
    fork, line = line_that_dropped_beta(tmp_path)
    assert list(read_drops(line.layout)) == ["tweak-beta"]
    assert read_series(line.layout.series).names == ["0001-keep-alpha.patch"]
    assert check_without_base(line.layout, log=quiet) == []
    # the refresh: seed copies the release line's whole series (on v1 the later patches may need
    # the dropped one's context), and the bump drops the recorded patch again without a stop
    seeded = seed_line(line.layout, log=quiet)
    assert seeded.patches == 2
    logged = []
    data = bump(line.layout, f"git:{fork.upstream}@v2", log=logged.append, test_runner=no_tests)
    assert any("tweak-beta: dropped (recorded in lines/ahead/patches/dropped)" in e for e in logged), logged
    rows = {r["patch_name"]: r for r in data["mapping"]}
    assert rows["tweak-beta"]["status"] == "dropped"
    assert "recorded in lines/ahead/patches/dropped: dropped by the bump onto" in rows["tweak-beta"]["note"]
    assert read_series(line.layout.series).names == ["0001-keep-alpha.patch"]
    assert list(read_drops(line.layout)) == ["tweak-beta"], "the record survives the refresh"
    # the release line is untouched: it still carries the patch
    assert read_series(fork.layout.series).names == ["0001-keep-alpha.patch", "0002-tweak-beta.patch"]


def test_abort_takes_the_recorded_drop_back(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    fork.upstream_commit({A: replace_line("alpha line 10\n", "alpha line 10 upstream\n")}, "upstream: a 10")
    fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 upstream\n")}, "upstream: beta 5")
    sh("git", "tag", "v2", cwd=fork.upstream)
    line = add_line(fork, "ahead")
    shutil.rmtree(line.layout.patches)
    shutil.copytree(fork.layout.patches, line.layout.patches)
    with pytest.raises(Stopped, match="keep-alpha"):
        bump(line.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=no_tests)
    with pytest.raises(Stopped, match="tweak-beta"):
        bump_continue(line.layout, drop=True, log=quiet, test_runner=no_tests)
    assert list(read_drops(line.layout)) == ["keep-alpha"]
    from tools.rebase.bump.bump import bump_abort

    bump_abort(line.layout, log=quiet)
    assert read_drops(line.layout) == {}
    assert not (line.layout.patches / "dropped").exists()


def test_a_drop_on_the_release_line_writes_no_record(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 upstream\n")}, "upstream: beta 5")
    sh("git", "tag", "v2", cwd=fork.upstream)
    with pytest.raises(Stopped):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=no_tests)
    bump_continue(fork.layout, drop=True, log=quiet, test_runner=no_tests)
    assert not (fork.layout.patches / "dropped").exists()


def test_seed_keeps_the_message_of_a_patch_the_line_reduced(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    line = add_line(fork, "ahead")
    shutil.rmtree(line.layout.patches)
    shutil.copytree(fork.layout.patches, line.layout.patches)
    path = line.layout.patches / "0002-tweak-beta.patch"
    path.write_text(path.read_text().replace(
        "Upstream-Status: fork-only test fixture",
        "Upstream-Status: fork-only reduced on this base").replace("Why it exists.", "Why the line keeps less."))
    apply(line.layout, log=quiet)
    seed_line(line.layout, log=quiet)
    reduced = parse_patch(path)
    assert reduced.upstream_status == "fork-only reduced on this base"
    assert "Why the line keeps less." in reduced.message
    assert "beta line 5 fork" in path.read_text()  # the release line's change
    kept = parse_patch(line.layout.patches / "0001-keep-alpha.patch")
    assert kept.upstream_status == "fork-only test fixture"


def test_check_lints_the_drops_file(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    line = add_line(fork, "ahead")
    shutil.rmtree(line.layout.patches)
    shutil.copytree(fork.layout.patches, line.layout.patches)
    drops = line.layout.patches / "dropped"
    drops.write_text("tweak-beta: absorbed upstream\n")
    problems = check_without_base(line.layout, log=quiet)
    assert any("'tweak-beta' is recorded as dropped but is in the line's series" in p for p in problems)
    drops.write_text("no reason here\n")
    assert any("expected `Patch-Name: reason`" in p for p in check_without_base(line.layout, log=quiet))
    with pytest.raises(RebaseError, match="listed twice"):
        parse_drops("a-b: x\na-b: y\n", "dropped")
    with pytest.raises(RebaseError, match="must be lowercase"):
        parse_drops("Bad_Name: x\n", "dropped")


def test_a_recorded_drop_in_the_middle_of_a_clean_stretch(tmp_path, cache):
    """A patch recorded as dropped that would merge cleanly is dropped too, and the patches after it
    replay on without it."""
    fork = make_fork(tmp_path)
    fork.stack(STACK + [("third", {A: replace_line("alpha line 3\n", "alpha line 3 fork\n")})])
    fork.upstream_commit({"megatron/core/gamma.py": lambda t: t + "GAMMA_UP = 1\n"}, "upstream: gamma")
    sh("git", "tag", "v2", cwd=fork.upstream)
    line = add_line(fork, "ahead")
    shutil.rmtree(line.layout.patches)
    shutil.copytree(fork.layout.patches, line.layout.patches)
    (line.layout.patches / "dropped").write_text("tweak-beta: absorbed upstream\n")
    data = bump(line.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=no_tests)
    assert [r["patch_name"] for r in data["mapping"] if r["new"]] == ["keep-alpha", "third"]
    assert read_series(line.layout.series).names == ["0001-keep-alpha.patch", "0002-third.patch"]
    assert "beta line 5 fork" not in (line.layout.patches / "0002-third.patch").read_text()


def test_a_dry_run_right_after_seed_forecasts_the_refresh(tmp_path, cache):
    """The refresh's forecast: after ``seed`` the line's work repo still holds the old stack, so the
    scratch copy rebuilds it; that rebuilt repo is the tool's own, not a foreign one to refuse."""
    from tools.rebase.bump import forecast

    fork, line = line_that_dropped_beta(tmp_path)
    seed_line(line.layout, log=quiet)
    data = forecast.forecast(line.layout, f"git:{fork.upstream}@v2")
    outcomes = {row["name"]: row["status"] for row in data["patches"]}
    assert outcomes == {"keep-alpha": "clean", "tweak-beta": "dropped"}, data["patches"]
