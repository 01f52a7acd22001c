"""Issue 14's safety net around issue 15's additions: the typed journal carries (and validates) the
stop's kind, conflict analysis and lint findings, and still loads a journal written without them;
a pick resolved by a recorded resolution is linted even when the bump was killed right after
committing it; the forecast is neither blocked by the checkout's lock nor killed by a kill point
nor stopped by local edits (it reports them); pytest never reads a Tests: id as an option."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools.bumpkit import (all_pass, assert_fresh_clone_report_is_the_committed_one, commit_checkout,
                                 ignore_generated, make_fork, quiet, replace_line, resolve_conflict, sh)
from tools.rebase.bump import journal
from tools.rebase.bump.journal_records import CorruptJournal
from tools.rebase.bump.bump import Stopped, bump, bump_continue
from tools.rebase.errors import RebaseError
from tools.rebase.bump.forecast import forecast
from tools.rebase.git.lock import locked

REPO_ROOT = Path(__file__).resolve().parents[3]
B, CFG = "megatron/core/beta.py", "megatron/core/config.py"


def stopped_fork(tmp_path):
    fork = make_fork(tmp_path)
    fork.stack([("tweak-beta", {B: replace_line("beta line 5\n", "beta line 5 fork\n")})])
    fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 upstream\n")}, "up: beta 5", tag="v2")
    with pytest.raises(Stopped):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=all_pass)
    return fork


# ---------------------------------------------------------------- the journal's new fields

def test_journal_without_the_new_stop_fields_loads_and_continues(tmp_path, cache):
    fork = stopped_fork(tmp_path)
    j = journal.load(fork.layout)
    assert j.stopped.kind == "conflict" and j.stopped.analysis["types"] == {B: "content"}
    path = journal.journal_path(fork.layout)
    data = json.loads(path.read_text())
    for key in ("kind", "analysis", "findings"):  # what a journal from before issue 15 holds
        del data["stopped"][key]
    path.write_text(json.dumps(data))
    old = journal.load(fork.layout)
    assert (old.stopped.kind, old.stopped.analysis, old.stopped.findings) == ("conflict", None, [])
    resolve_conflict(fork.work, B, "beta line 5 both")
    data = bump_continue(fork.layout, log=quiet, test_runner=all_pass)
    assert data["counts"]["modified"] == 1 and not journal.in_progress(fork.layout)


@pytest.mark.parametrize("field, value, named", [
    ("kind", "sideways", "stopped.kind 'sideways' is not one of conflict, lint"),
    ("analysis", {"types": {}, "files": {}, "also": []}, "stopped.analysis.causes is missing"),
    ("analysis", {"types": {}, "files": {}, "causes": [{"commit": "x", "subject": "s"}], "also": []},
     "stopped.analysis.causes must be a list of upstream commits"),
    ("findings", [{"path": "a.py"}], "stopped.findings must be a list of lint findings"),
    ("findings", "oops", "stopped.findings must be a list of lint findings"),
])
def test_damaged_stop_fields_are_named(tmp_path, cache, field, value, named):
    fork = stopped_fork(tmp_path)
    path = journal.journal_path(fork.layout)
    data = json.loads(path.read_text())
    data["stopped"][field] = value
    path.write_text(json.dumps(data))
    with pytest.raises(CorruptJournal, match=named.replace("(", r"\(").replace(".", r"\.")):
        journal.load(fork.layout)


def test_a_lint_stop_without_findings_is_refused(tmp_path, cache):
    fork = stopped_fork(tmp_path)
    path = journal.journal_path(fork.layout)
    data = json.loads(path.read_text())
    data["stopped"].update(kind="lint", findings=[])
    path.write_text(json.dumps(data))
    with pytest.raises(CorruptJournal, match="a lint stop carries its findings"):
        journal.load(fork.layout)


# ---------------------------------------------------------------- recorded resolution + lint

class Killed(BaseException):
    """Stands for SIGKILL: nothing of the bump's own error handling runs."""


def kill_at(point):
    def hook(name, **info):
        if name == point:
            raise Killed(name)
    return hook


def test_recorded_resolution_that_breaks_a_file_stops_even_after_a_kill(tmp_path, cache):
    fields = "".join(f"    f{i}: int = {i}\n" for i in range(30))
    files = {**__import__("tests.tools.bumpkit", fromlist=["UPSTREAM_FILES"]).UPSTREAM_FILES,
             CFG: "class Config:\n" + fields}
    fork = make_fork(tmp_path, files=files)
    fork.stack([("both", {B: replace_line("beta line 5\n", "beta line 5 fork\n"),
                          CFG: replace_line("    f2: int = 2\n", "    f2: int = 2\n    extra: int = 1\n")})])
    pin, patches = fork.layout.pin.read_bytes(), fork.patch_files()
    fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 upstream\n")}, "up: beta 5", tag="v2")
    with pytest.raises(Stopped):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=all_pass)
    resolve_conflict(fork.work, B, "beta line 5 both")
    bump_continue(fork.layout, log=quiet, test_runner=all_pass)  # records the resolution
    # v3 also adds `extra` far away: the recorded resolution applies and the merge is clean, broken.
    fork.upstream_commit({CFG: replace_line("    f27: int = 27\n", "    f27: int = 27\n    extra: int = 1\n")},
                         "up: extra", tag="v3")
    from tools.rebase.stack.workrepo import apply

    for name, hook in (("plain", None), ("killed", kill_at("after-pick"))):
        clone = make_fork(tmp_path, name=name)
        clone.layout.pin.write_bytes(pin)
        for fname, data in patches.items():
            (clone.layout.patches / fname).write_bytes(data)
        shutil.copytree(fork.layout.resolutions, clone.layout.resolutions)
        apply(clone.layout, log=quiet)
        kw = {"hook": hook} if hook else {}
        if hook:
            with pytest.raises(Killed):
                bump(clone.layout, f"git:{fork.upstream}@v3", log=quiet, test_runner=all_pass, **kw)
            assert journal.load(clone.layout).picking is not None  # committed, not yet recorded
            with pytest.raises(Stopped) as stop:
                bump_continue(clone.layout, log=quiet, test_runner=all_pass)
        else:
            with pytest.raises(Stopped) as stop:
                bump(clone.layout, f"git:{fork.upstream}@v3", log=quiet, test_runner=all_pass)
        assert "0001-both merged without a conflict" in str(stop.value), name
        assert "'extra' is defined twice in class Config" in str(stop.value)
        j = journal.load(clone.layout)
        assert j.phase == "stopped" and j.stopped.kind == "lint" and j.picking is None
        assert not any(o.outcome == "resolved-recorded" for o in j.outcomes)
        assert sh("git", "diff", "--cached", "--name-only", cwd=clone.work).split() == [B, CFG]


# ---------------------------------------------------------------- the forecast

def _state(fork):
    files, work = fork.snapshot()
    rebase = sorted(p.name for p in fork.layout.state_dir.iterdir())
    return files, work, rebase, (fork.layout.state_dir / "lock").read_bytes()


def test_forecast_is_not_blocked_by_the_lock_kill_points_or_local_edits(tmp_path, cache, monkeypatch):
    fork = make_fork(tmp_path)
    fork.stack([("tweak-beta", {B: replace_line("beta line 5\n", "beta line 5 fork\n")})])
    fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 upstream\n")}, "up: beta 5", tag="v2")
    edited = fork.layout.package / "core" / "beta.py"
    edited.write_text(edited.read_text() + "# local edit\n")
    # Another process holds the checkout's lock for the whole forecast.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom tools.rebase.git.lock import locked\nfrom tools.rebase.git.paths "
         f"import Layout\nwith locked(Layout(__import__('pathlib').Path({str(fork.root)!r})), 'holder'):\n"
         "    print('held', flush=True)\n    sys.stdin.read()\n"],
        cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = _state(fork)
        monkeypatch.setenv("FORK_REBASE_KILL_AT", "after-backup")  # would SIGKILL a real bump here
        data = forecast(fork.layout, f"git:{fork.upstream}@v2")
        assert _state(fork) == before and b"holder" in before[3]
    finally:
        holder.communicate("")
    with locked(fork.layout, "bump --dry-run caller"):  # a caller holding the lock itself
        again = forecast(fork.layout, f"git:{fork.upstream}@v2")
    assert data["would_stop"] and data["patches"][0]["status"] == "conflict"
    assert again["patches"] == data["patches"]
    assert any("a real bump would refuse to start now" in w and "local edits" in w for w in data["warnings"])
    assert edited.read_text().endswith("# local edit\n")
    with pytest.raises(RebaseError, match="local edits"):  # the real bump still refuses
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=all_pass)


def test_forecast_ignores_unlisted_patch_files_but_warns(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack([("tweak-beta", {B: replace_line("beta line 5\n", "beta line 5 fork\n")})])
    fork.upstream_commit({"megatron/core/alpha.py": replace_line("alpha line 3\n", "alpha line 3 up\n")},
                         "up: alpha", tag="v2")
    (fork.layout.patches / "9999-stray.patch").write_text("not a patch\n")
    data = forecast(fork.layout, f"git:{fork.upstream}@v2")
    assert [r["status"] for r in data["patches"]] == ["clean"] and not data["would_stop"]
    assert any("9999-stray.patch" in w for w in data["warnings"])
    assert (fork.layout.patches / "9999-stray.patch").read_text() == "not a patch\n"


# ---------------------------------------------------------------- pytest ids

def test_run_pytest_ends_options_before_the_ids(tmp_path):
    from tools.rebase.bump.bump import pytest_runner
    from tools.rebase.proof.testrun import run_pytest

    marker = tmp_path / "conftest-ran"
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "conftest.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    root = tmp_path / "root"
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "conftest.py").write_text("import no_such_module_for_conftest\n")
    (root / "tests" / "test_a.py").write_text("def test_ok():\n    pass\n")
    got = run_pytest(root, [f"--rootdir={tmp_path / 'evil'}"])  # even unchecked, never an option
    assert not marker.exists() and got[f"--rootdir={tmp_path / 'evil'}"] != "passed"

    class Lay:
        pass

    lay = Lay()
    lay.root = root
    got = pytest_runner(lay, "p", ["-pno:terminal", "tests/test_a.py::test_ok"])
    assert got["-pno:terminal"].startswith("refused: starts with '-'")
    assert got["tests/test_a.py::test_ok"].startswith("could not run: ") and "no_such_module" in \
        got["tests/test_a.py::test_ok"]


# ---------------------------------------------------------------- the record rebuilt from history

def test_fresh_clone_report_keeps_the_drop_note(tmp_path, cache):
    fork = make_fork(tmp_path)
    ignore_generated(fork)
    fork.stack([
        ("base-feature", {B: replace_line("beta line 10\n", "beta line 10 fork\nfork helper\n")}),
        ("uses-feature", {B: replace_line("fork helper\n", "fork helper used\n")}),
    ])
    commit_checkout(fork, "stack on v1")
    fork.upstream_commit({B: replace_line("beta line 10\n", "beta line 10 upstream\n")}, "up: beta 10", tag="v2")
    with pytest.raises(Stopped):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=all_pass)
    with pytest.raises(Stopped):  # uses-feature needed base-feature's lines
        bump_continue(fork.layout, drop=True, log=quiet, test_runner=all_pass)
    bump_continue(fork.layout, drop=True, log=quiet, test_runner=all_pass)
    commit_checkout(fork, "bump to v2")
    assert "later patches built on its lines: uses-feature" in fork.layout.report_md.read_text()
    assert_fresh_clone_report_is_the_committed_one(fork, tmp_path)
