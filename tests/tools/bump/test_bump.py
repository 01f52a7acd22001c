"""``bump`` on a synthetic git upstream: clean replay, absorbed vs dropped, conflict stop, continue,
abort, recorded resolutions replayed on a fresh clone, test re-runs, and the regenerated report."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools.bumpkit import clone_with_resolutions, make_fork, quiet, replace_line, sh
from tools.rebase.bump import journal
from tools.rebase.bump.bump import Stopped, bump, bump_abort, bump_continue
from tools.rebase.proof.check import check
from tools.rebase.errors import RebaseError
from tools.rebase.stack.pin import load_pin
from tools.rebase.stack.workrepo import apply

REPO_ROOT = Path(__file__).resolve().parents[3]
A, B, G, D = ("megatron/core/alpha.py", "megatron/core/beta.py", "megatron/core/gamma.py",
              "megatron/core/delta.py")



def no_runner(layout, name, ids):
    raise AssertionError(f"tests of {name} should not run")


def passing(layout, name, ids):
    """Every patch's Tests: run at the finishing gate; here they all pass."""
    return {i: "passed" for i in ids}


STACK = [
    ("keep-alpha", {A: replace_line("alpha line 10\n", "alpha line 10 fork\n")}),
    ("upstreamed", {G: replace_line("gamma line 20\n", "gamma line 20 fixed\n")}),
    ("tweak-beta", {B: replace_line("beta line 5\n", "beta line 5 fork\n")}),
    ("new-module", {"megatron/core/fork_extra.py": "EXTRA = 1\n"}),
]



def bump_stops(fork):
    """Bump onto the synthetic v2, which must stop at a conflict; return the Stopped error."""
    with pytest.raises(Stopped) as info:
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=passing)
    return info.value


def resolve_beta(fork, line):
    """Resolve the conflict in beta.py by replacing the marked region with ``line`` and stage it."""
    text = (fork.work / B).read_text()
    (fork.work / B).write_text(text.split("<<<<<<<")[0] + line + "\n" + text.split(">>>>>>>")[1].split("\n", 1)[1])
    sh("git", "add", B, cwd=fork.work)

def upstream_v2(fork, conflict=False):
    """v2: context drift next to keep-alpha, takes 'upstreamed' inside a bigger commit, and
    (optionally) rewrites the line tweak-beta changes."""
    fork.upstream_commit({A: replace_line("alpha line 12\n", "alpha line 12 upstream\n")}, "upstream: alpha 12")
    absorbing = fork.upstream_commit(
        {G: replace_line("gamma line 20\n", "gamma line 20 fixed\n"),
         D: replace_line("delta line 3\n", "delta line 3 upstream\n")},
        "upstream: fix gamma 20 and touch delta")
    conflicting = None
    if conflict:
        conflicting = fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 upstream\n")},
                                           "upstream: rewrite beta 5")
    sh("git", "tag", "v2", cwd=fork.upstream)
    return absorbing, conflicting


def test_clean_bump_updates_pin_patches_and_report(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    absorbing, _ = upstream_v2(fork)
    v2 = sh("git", "rev-parse", "v2", cwd=fork.upstream).strip()
    data = bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=passing)
    pin = load_pin(fork.layout.pin)
    assert (pin.kind, pin.commit, pin.ref) == ("git", v2, "v2")
    assert sorted(p.name for p in fork.layout.patches.glob("*.patch")) == [
        "0001-keep-alpha.patch", "0002-tweak-beta.patch", "0003-new-module.patch"]
    assert check(fork.layout, log=quiet) == []
    rows = {(r["old"] or r["new"])[0]["subject"]: r for r in data["mapping"]}
    assert rows["keep-alpha"]["status"] == "refreshed"
    assert rows["upstreamed"]["status"] == "absorbed"
    assert rows["upstreamed"]["upstream_commit"] == absorbing
    assert rows["tweak-beta"]["status"] == "renumbered"
    assert rows["new-module"]["status"] == "renumbered"
    saved = json.loads(fork.layout.report_json.read_text())
    assert saved == data
    md = fork.layout.report_md.read_text()
    assert f"at `{v2}`" in md and "upstream: fix gamma 20 and touch delta" in md
    assert not journal.journal_path(fork.layout).exists()
    # megatron/ is left to apply, which materializes the new stack on v2 without rebuilding it
    lines = []
    apply(fork.layout, log=lines.append)
    assert lines[0].startswith("up to date: 3 patches")
    alpha = (fork.root / A).read_text()
    assert "alpha line 10 fork" in alpha and "alpha line 12 upstream" in alpha


def test_report_regenerates_byte_identically_for_last_bump(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork)
    bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=passing)
    md, js = fork.layout.report_md.read_bytes(), fork.layout.report_json.read_bytes()
    fork.layout.report_md.unlink()
    fork.layout.report_json.unlink()
    env = dict(os.environ, FORK_REBASE_CACHE=str(cache))
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "tools.rebase", "-C", str(fork.root), "report"],
                              cwd=REPO_ROOT, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert fork.layout.report_md.read_bytes() == md
        assert fork.layout.report_json.read_bytes() == js


def test_conflict_stop_summary_then_continue_records_resolution(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    _, conflicting = upstream_v2(fork, conflict=True)
    with pytest.raises(Stopped) as stop:
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=passing)
    text = str(stop.value)
    assert "patch 0003-tweak-beta" in text and B in text
    assert f"{conflicting[:12]} upstream: rewrite beta 5" in text
    assert "upstream: alpha 12" not in text  # only commits touching the conflicting file
    assert "<<<<<<<" in (fork.work / B).read_text()
    with pytest.raises(RebaseError, match="still unmerged"):
        bump_continue(fork.layout, log=quiet, test_runner=passing)
    (fork.work / B).write_text((fork.work / B).read_text().split("<<<<<<<")[0]
                               + "beta line 5 upstream and fork\n"
                               + (fork.work / B).read_text().split(">>>>>>>")[1].split("\n", 1)[1])
    sh("git", "add", B, cwd=fork.work)
    ran = []

    def runner(layout, name, ids):
        ran.append((name, ids, "beta line 5 upstream and fork" in (layout.root / B).read_text()))
        return {i: "passed" for i in ids}

    data = bump_continue(fork.layout, log=quiet, test_runner=runner)
    # every patch's tests run at the finish, each on the bumped tree
    assert ran == [(n, ["tests/test_dummy.py::test_ok"], True) for n in ("keep-alpha", "tweak-beta", "new-module")]
    stored = list((fork.layout.resolutions / "tweak-beta").iterdir())
    assert len(stored) == 1 and (stored[0] / "postimage").is_file()
    assert "beta line 5 upstream and fork" in (stored[0] / "postimage").read_text()
    row = next(r for r in data["mapping"] if r["new"] and r["new"][0]["subject"] == "tweak-beta")
    assert row["status"] == "modified" and "conflict resolved by hand" in row["note"]
    assert row["tests"] == {"tests/test_dummy.py::test_ok": "passed"}
    assert "++beta line 5 upstream and fork" in row["interdiff"]
    assert check(fork.layout, log=quiet) == []


def test_recorded_resolution_replays_on_a_fresh_clone(tmp_path, cache, monkeypatch):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork, conflict=True)
    before_pin, before_patches = fork.layout.pin.read_bytes(), fork.patch_files()
    bump_stops(fork)
    resolve_beta(fork, "beta line 5 both")
    bump_continue(fork.layout, log=quiet, test_runner=lambda l, n, ids: {i: "passed" for i in ids})
    after = fork.patch_files()
    # Another machine: the old pin and patches plus the committed resolutions, fresh work repo and cache.
    clone = clone_with_resolutions(tmp_path, fork, before_pin, before_patches, monkeypatch)
    ran = []
    data = bump(clone.layout, f"git:{fork.upstream}@v2", log=quiet,
                test_runner=lambda l, n, ids: ran.append(n) or {i: "passed" for i in ids})
    assert ran == ["keep-alpha", "tweak-beta", "new-module"]  # every patch's, at the finish
    assert clone.patch_files() == after
    row = next(r for r in data["mapping"] if r["new"] and r["new"][0]["subject"] == "tweak-beta")
    assert "recorded resolution" in row["note"]


def stops_on_its_tests_then_finishes_without_them(tmp_path, resolution, outcome, match):
    """A conflict resolved with ``resolution`` whose Tests: all come back ``outcome``: the bump
    stops with ``match`` and finalizes nothing; continued with run_tests=False it finishes."""
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork, conflict=True)
    bump_stops(fork)
    resolve_beta(fork, resolution)
    old_pin = fork.layout.pin.read_bytes()
    with pytest.raises(Stopped, match=match):
        bump_continue(fork.layout, log=quiet, test_runner=lambda l, n, ids: {i: outcome for i in ids})
    assert fork.layout.pin.read_bytes() == old_pin  # nothing finalized
    data = bump_continue(fork.layout, log=quiet, run_tests=False, test_runner=no_runner)
    assert data["new"]["count"] == 3


def test_failing_tests_after_replayed_resolution_stop_the_bump(tmp_path, cache):
    stops_on_its_tests_then_finishes_without_them(
        tmp_path, "beta line 5 broken", "failed",
        r"tweak-beta: tests/test_dummy.py::test_ok: fails only with the stack \(a patch or its resolution broke it\)")


def test_abort_restores_everything_exactly(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    fork.layout.report_md.write_text("previous report\n")
    upstream_v2(fork, conflict=True)
    before = fork.snapshot()
    bump_stops(fork)
    (fork.work / "scratch.txt").write_text("maintainer's half-done work\n")
    with pytest.raises(RebaseError, match="already in progress"):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet)
    bump_abort(fork.layout, log=quiet)
    assert fork.snapshot() == before
    assert not journal.bump_dir(fork.layout).joinpath("journal.json").exists()
    with pytest.raises(RebaseError, match="no bump in progress"):
        bump_abort(fork.layout, log=quiet)


def test_drop_on_purpose_is_not_absorbed(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    absorbing, _ = upstream_v2(fork, conflict=True)
    bump_stops(fork)
    data = bump_continue(fork.layout, drop=True, log=quiet, test_runner=passing)
    rows = {(r["old"] or r["new"])[0]["subject"]: r for r in data["mapping"]}
    assert rows["tweak-beta"]["status"] == "dropped" and "on purpose" in rows["tweak-beta"]["note"]
    assert rows["upstreamed"]["status"] == "absorbed" and rows["upstreamed"]["upstream_commit"] == absorbing
    assert not (fork.layout.patches / "0002-tweak-beta.patch").exists()
    assert data["counts"]["dropped"] == 1 and data["counts"]["absorbed"] == 1


def test_conflicting_patch_already_upstream_is_absorbed_without_stopping(tmp_path, cache):
    """Upstream took the change and then edited the same line again: replay conflicts, but the
    patch-id of an upstream commit in old..new matches, so it is absorbed, naming that commit."""
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    taken = fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 fork\n")}, "upstream: take beta fix")
    fork.upstream_commit({B: replace_line("beta line 5 fork\n", "beta line 5 fork, refined\n")}, "upstream: refine")
    sh("git", "tag", "v2", cwd=fork.upstream)
    data = bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=passing)
    row = next(r for r in data["mapping"] if r["old"] and r["old"][0]["subject"] == "tweak-beta")
    assert row["status"] == "absorbed" and row["upstream_commit"] == taken


KILL_SCRIPT = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
os.environ["BUMP_PID"] = str(os.getpid())
from tools.rebase.git.paths import Layout
from tools.rebase.bump.bump import bump
def hook(point, **info):
    if point == {point!r}:
        os.kill(os.getpid(), signal.SIGKILL)
bump(Layout(Path({root!r})), {spec!r}, log=lambda *a: None, hook=hook,
     test_runner=lambda l, n, ids: {{i: "passed" for i in ids}})
"""

# Installed in the work repo: kills git (mid `git rebase`) and the bump after the n-th replayed commit.
GIT_KILL_HOOK = """#!/bin/sh
n=$(cat "$KILL_COUNT" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$KILL_COUNT"
if [ "$n" -eq "$KILL_AFTER" ]; then kill -9 "$BUMP_PID" "$PPID"; sleep 5; fi
"""


def _killed_bump(fork, cache, point):
    """Run a bump in a subprocess and SIGKILL it at ``point``: a python hook point, or
    ``git:N`` = inside `git rebase`, right after it committed the N-th patch."""
    env = dict(os.environ, FORK_REBASE_CACHE=str(cache))
    hook_file = fork.work / ".git" / "hooks" / "post-commit"
    if point.startswith("git:"):
        hook_file.parent.mkdir(exist_ok=True)
        hook_file.write_text(GIT_KILL_HOOK)
        hook_file.chmod(0o755)
        env.update(KILL_AFTER=point[4:], KILL_COUNT=str(fork.root.parent / "kill-count"),
                   FORK_REBASE_GIT_HOOKS=str(hook_file.parent))  # the tool runs no hooks unless told
    script = KILL_SCRIPT.format(repo=str(REPO_ROOT), point=point, root=str(fork.root),
                                spec=f"git:{fork.upstream}@v2")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    hook_file.unlink(missing_ok=True)
    assert proc.returncode == -9, proc.stderr
    assert journal.journal_path(fork.layout).exists()


@pytest.fixture(scope="module")
def reference_bump(tmp_path_factory):
    """The uninterrupted bump every killed-and-continued one must reproduce."""
    tmp = tmp_path_factory.mktemp("reference")
    old = os.environ.get("FORK_REBASE_CACHE")
    os.environ["FORK_REBASE_CACHE"] = str(tmp / "cache")
    try:
        ref = make_fork(tmp, name="reference")
        ref.stack(STACK)
        upstream_v2(ref)
        data = bump(ref.layout, f"git:{ref.upstream}@v2", log=quiet, test_runner=passing)
    finally:
        os.environ.pop("FORK_REBASE_CACHE") if old is None else os.environ.update(FORK_REBASE_CACHE=old)
    rows = [(r["status"], [c["subject"] for c in r["old"]], [c["subject"] for c in r["new"]], r["note"])
            for r in data["mapping"]]
    return ref.patch_files(), load_pin(ref.layout.pin).commit, rows


@pytest.mark.parametrize("point", ["after-backup", "git:2", "after-rebase", "after-pin", "after-export"])
def test_killed_bump_continues_to_the_same_result(tmp_path, cache, point, reference_bump):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork)
    _killed_bump(fork, cache, point)
    if point == "git:2":
        assert (fork.work / ".git" / "rebase-merge").is_dir()  # really killed inside git
    data = bump_continue(fork.layout, log=quiet, test_runner=passing)
    files, commit, rows = reference_bump
    assert fork.patch_files() == files
    assert load_pin(fork.layout.pin).commit == commit
    assert [(r["status"], [c["subject"] for c in r["old"]], [c["subject"] for c in r["new"]], r["note"])
            for r in data["mapping"]] == rows
    assert json.loads(fork.layout.report_json.read_text()) == data
    assert not journal.journal_path(fork.layout).exists()


@pytest.mark.parametrize("point", ["git:1", "after-export"])
def test_killed_bump_aborts_to_the_exact_previous_state(tmp_path, cache, point):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork)
    before = fork.snapshot()
    _killed_bump(fork, cache, point)
    proc = subprocess.run([sys.executable, "-m", "tools.rebase", "-C", str(fork.root), "bump", "--abort"],
                          cwd=REPO_ROOT, env=dict(os.environ, FORK_REBASE_CACHE=str(cache)),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert fork.snapshot() == before
    assert not (fork.work / ".git" / "rebase-merge").exists()
    assert sh("git", "status", "--porcelain", cwd=fork.work) == ""


def test_bad_specs_are_named(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK[:1])
    with pytest.raises(RebaseError, match="bad spec 'megatron-core==1'"):
        bump(fork.layout, "megatron-core==1", log=quiet)
    with pytest.raises(RebaseError, match="could not fetch 'nope'"):
        bump(fork.layout, f"git:{fork.upstream}@nope", log=quiet)
    with pytest.raises(RebaseError, match="already on"):
        bump(fork.layout, f"git:{fork.upstream}@v1", log=quiet)
    assert not journal.journal_path(fork.layout).exists()


def test_abort_after_failed_tests_restores_the_materialized_tree(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork, conflict=True)
    before = fork.snapshot()
    materialized = (fork.root / B).read_text()
    bump_stops(fork)
    resolve_beta(fork, "beta line 5 broken")
    with pytest.raises(Stopped, match="tests fail on the bumped stack"):
        bump_continue(fork.layout, log=quiet, test_runner=lambda l, n, ids: {i: "failed" for i in ids})
    assert "beta line 5 broken" in (fork.root / B).read_text()  # tests ran against the bumped tree
    bump_abort(fork.layout, log=quiet)
    assert fork.snapshot() == before
    assert (fork.root / B).read_text() == materialized


def resolved_at_its_stop_keeping(tmp_path, resolution):
    """A fork whose bump onto v2 stopped at beta.py's conflict, resolved with ``resolution``, and
    its megatron/ files as they were before the bump began."""
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork, conflict=True)
    before = _package_files(fork)
    bump_stops(fork)
    resolve_beta(fork, resolution)
    return fork, before


def resolved_at_its_stop(tmp_path, resolution):
    """A fork whose bump onto v2 stopped at beta.py's conflict, resolved with ``resolution``."""
    return resolved_at_its_stop_keeping(tmp_path, resolution)[0]


def _package_files(fork):
    base = fork.layout.package
    return {p.relative_to(base).as_posix(): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def _passing_runner_seeing(seen):
    return lambda layout, name, ids: seen.append((layout.root / B).read_text()) or {i: "passed" for i in ids}


def test_finished_bump_puts_back_the_tree_the_last_apply_built(tmp_path, cache):
    fork, before = resolved_at_its_stop_keeping(tmp_path, "beta line 5 both")
    seen, logs = [], []
    bump_continue(fork.layout, log=logs.append, test_runner=_passing_runner_seeing(seen))
    assert len(seen) == 3 and all("beta line 5 both" in x for x in seen)  # every patch's, on the bumped tree
    assert _package_files(fork) == before  # then megatron/ is what the last apply built again
    assert "0+bump.testing" not in (fork.layout.package / "core" / "package_info.py").read_text()
    assert any("apply` to materialize megatron/" in m for m in logs)
    apply(fork.layout, log=quiet)
    assert "beta line 5 both" in (fork.root / B).read_text()


def test_tests_run_again_after_a_fix_still_give_back_the_pre_bump_tree(tmp_path, cache):
    # The copy is taken once: the second test run (after a fix at the test stop) must not save
    # the tree the first run wrote.
    fork, before = resolved_at_its_stop_keeping(tmp_path, "beta line 5 broken")
    with pytest.raises(Stopped, match="tests fail on the bumped stack"):
        bump_continue(fork.layout, log=quiet, test_runner=lambda l, n, ids: {i: "failed" for i in ids})
    assert "beta line 5 broken" in (fork.root / B).read_text()
    text = (fork.work / B).read_text()
    (fork.work / B).write_text(text.replace("beta line 5 broken", "beta line 5 both"))
    sh("git", "commit", "-q", "-a", "--amend", "--no-edit", cwd=fork.work)
    seen = []
    bump_continue(fork.layout, log=quiet, test_runner=_passing_runner_seeing(seen))
    assert len(seen) == 3 and all("beta line 5 both" in x for x in seen)
    assert _package_files(fork) == before


def test_bump_without_megatron_before_leaves_none_after(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork, conflict=True)
    shutil.rmtree(fork.layout.package)
    bump_stops(fork)
    resolve_beta(fork, "beta line 5 both")
    seen = []
    bump_continue(fork.layout, log=quiet, test_runner=_passing_runner_seeing(seen))
    assert len(seen) == 3 and not fork.layout.package.exists()


def test_hand_edits_to_the_tested_tree_survive_the_finish_with_a_warning(tmp_path, cache):
    fork = resolved_at_its_stop(tmp_path, "beta line 5 broken")
    with pytest.raises(Stopped, match="tests fail on the bumped stack"):
        bump_continue(fork.layout, log=quiet, test_runner=lambda l, n, ids: {i: "failed" for i in ids})
    edited = fork.layout.package / "core" / "alpha.py"
    edited.write_text(edited.read_text() + "# tried by hand\n")
    logs = []
    bump_continue(fork.layout, log=logs.append, run_tests=False, test_runner=no_runner)
    assert edited.read_text().endswith("# tried by hand\n")
    assert "beta line 5 broken" in (fork.root / B).read_text()
    assert any("has edits made during the bump" in m and "alpha.py" in m for m in logs)


def test_report_without_a_recorded_bump_says_what_to_do(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK[:1])
    proc = subprocess.run([sys.executable, "-m", "tools.rebase", "-C", str(fork.root), "report"],
                          cwd=REPO_ROOT, env=dict(os.environ, FORK_REBASE_CACHE=str(cache)),
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "no bump recorded in this checkout" in proc.stderr and "--old REV" in proc.stderr


def test_resolution_committed_by_hand_is_adopted_with_original_message_and_author(tmp_path, cache):
    ref = make_fork(tmp_path, name="reference")
    ref.stack(STACK)
    upstream_v2(ref, conflict=True)
    forks = []
    for fork, by_hand in ((ref, False), (make_fork(tmp_path), True)):
        if by_hand:
            fork.stack(STACK)
        with pytest.raises(Stopped):
            bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=passing)
        text = (fork.work / B).read_text()
        (fork.work / B).write_text(text.split("<<<<<<<")[0] + "beta line 5 both\n"
                                   + text.split(">>>>>>>")[1].split("\n", 1)[1])
        sh("git", "add", B, cwd=fork.work)
        if by_hand:  # with their own identity, date and message
            env = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_AUTHOR_NAME="Someone", GIT_AUTHOR_EMAIL="s@x.invalid",
                       GIT_COMMITTER_NAME="Someone", GIT_COMMITTER_EMAIL="s@x.invalid")
            subprocess.run(["git", "commit", "-q", "-m", "my resolution"], cwd=fork.work, env=env, check=True)
        bump_continue(fork.layout, log=quiet, test_runner=lambda l, n, ids: {i: "passed" for i in ids})
        forks.append(fork)
    assert forks[1].patch_files() == forks[0].patch_files()
    assert (forks[1].layout.resolutions / "tweak-beta").is_dir()
    assert sh("git", "rev-parse", "HEAD", cwd=forks[1].work) == sh("git", "rev-parse", "HEAD", cwd=forks[0].work)


def test_report_run_tests_for_the_last_bump(tmp_path, cache):
    fork = make_fork(tmp_path)
    (fork.root / "tests" / "test_dummy.py").write_text(
        "from pathlib import Path\n\n\ndef test_ok():\n"
        "    assert 'alpha line 12 upstream' in (Path(__file__).parents[1] / 'megatron/core/alpha.py').read_text()\n")
    fork.stack(STACK)
    upstream_v2(fork)
    bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=passing)
    proc = subprocess.run([sys.executable, "-m", "tools.rebase", "-C", str(fork.root), "report", "--run-tests",
                           "--output", str(tmp_path / "t.md"), "--json", str(tmp_path / "t.json")],
                          cwd=REPO_ROOT, env=dict(os.environ, FORK_REBASE_CACHE=str(cache)),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["tests_run"] and [r.get("tests") for r in data["mapping"] if r["new"]] == [
        {"tests/test_dummy.py::test_ok": "passed"}] * 3
    assert "| Tests |" in (tmp_path / "t.md").read_text()


def test_cli_stop_and_continue_exit_codes(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork, conflict=True)
    env = dict(os.environ, FORK_REBASE_CACHE=str(cache))
    run = lambda *args: subprocess.run([sys.executable, "-m", "tools.rebase", "-C", str(fork.root), "bump", *args],
                                       cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    proc = run("--onto", f"git:{fork.upstream}@v2", "--no-tests")
    assert proc.returncode == 1 and "bump stopped: patch 0003-tweak-beta" in proc.stderr
    assert "error:" not in proc.stderr
    proc = run("--abort", "--drop")
    assert proc.returncode == 2 and "--drop goes with --continue" in proc.stderr
    proc = run("--continue", "--drop")
    assert proc.returncode == 0, proc.stderr
    assert "bump done" in proc.stdout and "1 dropped" in proc.stdout
    assert load_pin(fork.layout.pin).ref == "v2"


def test_report_names_the_old_stack_a_fresh_clone_builds(tmp_path, cache):
    """Hand-made commits in the work repo (user committer) must not leak into the report."""
    fork = make_fork(tmp_path)
    fork.stack(STACK)  # commits made by hand: committer and dates are the maintainer's
    hand_tip = sh("git", "rev-parse", "HEAD", cwd=fork.work).strip()
    clone = make_fork(tmp_path, name="clone")
    shutil.rmtree(clone.layout.patches)
    shutil.copytree(fork.layout.patches, clone.layout.patches)
    apply(clone.layout, log=quiet)
    fresh_tip = sh("git", "rev-parse", "HEAD", cwd=clone.work).strip()
    assert fresh_tip != hand_tip
    upstream_v2(fork)
    data = bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=passing)
    assert data["old"]["tip"] == fresh_tip
    assert f"Old stack: {len(STACK)} patches, tip `{fresh_tip}`" in fork.layout.report_md.read_text()


def test_apply_and_export_refuse_while_a_bump_is_stopped(tmp_path, cache):
    from tools.rebase.stack.workrepo import export

    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork, conflict=True)
    bump_stops(fork)
    conflicted = (fork.work / B).read_text()
    for operation in (apply, export):
        with pytest.raises(RebaseError, match=r"a bump is in progress .*bump --continue.*bump --abort"):
            operation(fork.layout, log=quiet)
    assert (fork.work / B).read_text() == conflicted, "the half-resolved work must stay as it was"
    bump_abort(fork.layout, log=quiet)
    apply(fork.layout, log=quiet)  # allowed again once the bump is over


def test_skipped_tests_next_to_passing_ones_do_not_stop_the_bump(tmp_path, cache):
    # A resolved patch's GPU-only tests skip on a CPU machine: the bump finishes on the ones that
    # ran, and the report still shows the skipped one.
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork, conflict=True)
    bump_stops(fork)
    resolve_beta(fork, "beta line 5 both")
    gpu = "tests/test_dummy.py::test_on_gpu"
    data = bump_continue(fork.layout, log=quiet,
                         test_runner=lambda l, n, ids: {**{i: "passed" for i in ids}, gpu: "skipped"})
    row = next(r for r in data["mapping"] if r["new"] and r["new"][0]["subject"] == "tweak-beta")
    assert row["tests"][gpu] == "skipped"


def test_a_patch_whose_tests_all_skip_stops_as_could_not_run(tmp_path, cache):
    stops_on_its_tests_then_finishes_without_them(
        tmp_path, "beta line 5 both", "skipped",
        r"could not run \(the environment.*\n(  .*\n)*  tweak-beta: every Tests: id was skipped")


def test_tests_of_resolved_patches_see_the_new_bases_pin(tmp_path, cache):
    # The checkout's pin is still the old base while the bump tests: the pristine-upstream oracle
    # of the tests must compare against the new one, which the bump names in the environment.
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork, conflict=True)
    bump_stops(fork)
    resolve_beta(fork, "beta line 5 both")
    old_pin = fork.layout.pin.read_text()
    seen = []

    def runner(layout, name, ids):
        seen.append(Path(os.environ["FORK_REBASE_TESTED_PIN"]).read_text())
        return {i: "passed" for i in ids}

    bump_continue(fork.layout, log=quiet, test_runner=runner)
    assert seen and seen[0] != old_pin and seen[0] == fork.layout.pin.read_text()
    assert "FORK_REBASE_TESTED_PIN" not in os.environ


def test_edits_of_cleanly_merged_files_at_a_stop_replay_on_a_fresh_clone(tmp_path, cache, monkeypatch):
    # rerere keeps only the conflicting hunks; an edit the resolution needed in a file that merged
    # cleanly next to the conflict (upstream main defining a field twice) must replay as well.
    stack = [(n, dict(c)) for n, c in STACK]
    tweak = next(c for n, c in stack if n == "tweak-beta")
    tweak[D] = replace_line("delta line 30\n", "delta line 30 fork\n")
    fork = make_fork(tmp_path)
    fork.stack(stack)
    upstream_v2(fork, conflict=True)
    before_pin, before_patches = fork.layout.pin.read_bytes(), fork.patch_files()
    bump_stops(fork)
    resolve_beta(fork, "beta line 5 both")
    delta = fork.work / D
    delta.write_text(delta.read_text().replace("delta line 30 fork\n", "delta line 30 fork, fitted to v2\n"))
    sh("git", "add", D, cwd=fork.work)
    bump_continue(fork.layout, log=quiet, test_runner=lambda l, n, ids: {i: "passed" for i in ids})
    after = fork.patch_files()
    assert any("fitted to v2" in text.decode() for text in after.values())
    clone = clone_with_resolutions(tmp_path, fork, before_pin, before_patches, monkeypatch)
    bump(clone.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=lambda l, n, ids: {i: "passed" for i in ids})
    assert clone.patch_files() == after
    assert check(clone.layout, log=quiet) == []
