"""Frictions a maintainer met bumping a line (issue 54, item 6), each on a toy fork.

- ``--no-tests`` given to ``bump --onto`` was forgotten by ``bump --continue``: the tests ran anyway
  (11 minutes nobody asked for), and the stop message said to continue without the flag;
- ``--drop`` deleted the dropped patch's recorded resolutions (a line's next refresh meets the
  patch again and needs them);
- ``check`` during a stopped bump reported false problems about the bump's own recordings (and
  rebuilt the stack in the work repo the bump was stopped in);
- undoing a finished bump with the commands it prints left its record, so ``report`` rewrote the
  committed report as the undone bump.
"""

import shutil

import pytest

from tests.tools.bumpkit import (
    A,
    B,
    TWO_PATCH_STACK,
    add_line,
    commit_checkout,
    ignore_generated,
    make_fork,
    quiet,
    replace_line,
    resolve_conflict,
    sh,
)
from tools.rebase.bump import journal as jr
from tools.rebase.bump.bump import Stopped, bump, bump_continue
from tools.rebase.proof.check import check, check_without_base


class Runner:
    """A bump's test runner that records which patches' tests ran; every test passes."""

    def __init__(self):
        self.ran = []

    def __call__(self, layout, name, ids):
        self.ran.append(name)
        return {i: "passed" for i in ids}


def _alpha_conflict(fork, tag="v2", text="alpha line 10 upstream\n"):
    fork.upstream_commit({A: replace_line("alpha line 10\n", text)}, f"upstream: alpha 10 ({tag})")
    sh("git", "tag", tag, cwd=fork.upstream)


def test_no_tests_is_kept_across_continue(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(TWO_PATCH_STACK)
    _alpha_conflict(fork)
    runner = Runner()
    with pytest.raises(Stopped, match="keep-alpha"):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=runner, run_tests=False)
    assert jr.load(fork.layout).run_tests is False
    resolve_conflict(fork.work, A, "alpha line 10 upstream fork")
    bump_continue(fork.layout, log=quiet, test_runner=runner)  # no --no-tests given again
    assert runner.ran == [], "bump --continue ran the tests the bump was started without"


def test_no_tests_given_at_continue_holds_for_the_rest_of_the_bump(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(TWO_PATCH_STACK)
    _alpha_conflict(fork)
    fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 upstream\n")}, "upstream: beta 5")
    sh("git", "tag", "-f", "v2", cwd=fork.upstream)
    runner = Runner()
    with pytest.raises(Stopped, match="keep-alpha"):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=runner)
    resolve_conflict(fork.work, A, "alpha line 10 upstream fork")
    with pytest.raises(Stopped, match="tweak-beta"):
        bump_continue(fork.layout, log=quiet, test_runner=runner, run_tests=False)
    resolve_conflict(fork.work, B, "beta line 5 upstream fork")
    bump_continue(fork.layout, log=quiet, test_runner=runner)
    assert runner.ran == []


def _line_with_beta_resolution(tmp_path):
    """Line ``ahead`` bumped onto v2 with a hand resolution of tweak-beta recorded."""
    fork = make_fork(tmp_path)
    fork.stack(TWO_PATCH_STACK)
    fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 upstream\n")}, "upstream: beta 5")
    sh("git", "tag", "v2", cwd=fork.upstream)
    line = add_line(fork, "ahead")
    shutil.rmtree(line.layout.patches)
    shutil.copytree(fork.layout.patches, line.layout.patches)
    with pytest.raises(Stopped, match="tweak-beta"):
        bump(line.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=Runner())
    resolve_conflict(line.work, B, "beta line 5 upstream fork")
    bump_continue(line.layout, log=quiet, test_runner=Runner())
    assert (line.layout.resolutions / "tweak-beta").is_dir()
    return fork, line


def test_drop_keeps_the_dropped_patchs_recorded_resolutions(tmp_path, cache):
    fork, line = _line_with_beta_resolution(tmp_path)
    recorded = sorted(p.relative_to(line.layout.resolutions).as_posix()
                      for p in line.layout.resolutions.rglob("*") if p.is_file())
    fork.upstream_commit({B: replace_line("beta line 5 upstream\n", "beta line 5 upstream v3\n")},
                         "upstream: beta 5 again")
    sh("git", "tag", "v3", cwd=fork.upstream)
    with pytest.raises(Stopped, match="tweak-beta"):
        bump(line.layout, f"git:{fork.upstream}@v3", log=quiet, test_runner=Runner())
    bump_continue(line.layout, drop=True, log=quiet, test_runner=Runner())
    kept = sorted(p.relative_to(line.layout.resolutions).as_posix()
                  for p in line.layout.resolutions.rglob("*") if p.is_file())
    assert kept == recorded, "the drop deleted tweak-beta's recorded resolutions"
    # the line records the drop, and check takes the kept resolutions as the dropped patch's
    assert check_without_base(line.layout, log=quiet) == []


def test_check_during_a_stopped_bump_says_so_and_touches_nothing(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(TWO_PATCH_STACK)
    _alpha_conflict(fork)
    with pytest.raises(Stopped):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=Runner())
    head = sh("git", "rev-parse", "HEAD", cwd=fork.work)
    status = sh("git", "status", "--porcelain", cwd=fork.work)
    for run in (check, check_without_base):
        problems = run(fork.layout, log=quiet)
        assert len(problems) == 1, problems
        assert "a bump onto" in problems[0] and "in progress" in problems[0], problems
        assert "bump --continue" in problems[0] and "bump --abort" in problems[0]
    assert sh("git", "rev-parse", "HEAD", cwd=fork.work) == head
    assert sh("git", "status", "--porcelain", cwd=fork.work) == status, "check changed the stopped bump"


def _undo_as_printed(fork, hint):
    """Run the undo command a finished bump printed (``git checkout ... && git clean ...``)."""
    command = hint.split("(before committing it): ", 1)[1].split(", then ", 1)[0]
    for part in command.split(" && "):
        sh(*part.split(), cwd=fork.root)


def test_undoing_a_finished_bump_forgets_its_record(tmp_path, cache):
    from tools.rebase.bump.lastreport import report_last_bump
    from tools.rebase.report.report import write_report
    from tools.rebase.stack.workrepo import apply

    fork = make_fork(tmp_path)
    ignore_generated(fork)
    fork.stack(TWO_PATCH_STACK)
    commit_checkout(fork, "the stack on v1")
    fork.upstream_commit({"megatron/core/gamma.py": replace_line("gamma line 3\n", "gamma line 3 up\n")},
                         "upstream: gamma", tag="v2")
    bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=Runner())
    commit_checkout(fork, "bump onto v2")
    committed_md = fork.layout.report_md.read_bytes()
    fork.upstream_commit({"megatron/core/delta.py": replace_line("delta line 3\n", "delta line 3 up\n")},
                         "upstream: delta", tag="v3")
    logged = []
    bump(fork.layout, f"git:{fork.upstream}@v3", log=logged.append, test_runner=Runner())
    hint = next(e for e in logged if "to undo it" in e)
    _undo_as_printed(fork, hint)
    apply(fork.layout, log=quiet)
    assert fork.layout.report_md.read_bytes() == committed_md
    data = report_last_bump(fork.layout)
    write_report(data, fork.layout.report_md, fork.layout.report_json)
    assert fork.layout.report_md.read_bytes() == committed_md, "report rewrote the report as the undone bump"
    assert not (jr.last_bump_dir(fork.layout) / "record.json").exists()


def test_the_mirror_is_kept_for_continue(tmp_path, cache, monkeypatch):
    from tools.rebase.stack import gitsource as source

    fork = make_fork(tmp_path)
    fork.stack(TWO_PATCH_STACK)
    _alpha_conflict(fork)
    mirror = tmp_path / "mirror"
    sh("git", "clone", "-q", "--mirror", str(fork.upstream), str(mirror), cwd=tmp_path)
    monkeypatch.setattr(source, "MIRRORS", {})
    source.use_mirror(str(fork.upstream), mirror)
    with pytest.raises(Stopped):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=Runner())
    assert jr.load(fork.layout).mirror == str(mirror.resolve())
    source.MIRRORS.clear()  # a new process: `bump --continue` takes no --mirror
    resolve_conflict(fork.work, A, "alpha line 10 upstream fork")
    bump_continue(fork.layout, log=quiet, test_runner=Runner())
    assert source.MIRRORS == {str(fork.upstream): str(mirror.resolve())}
