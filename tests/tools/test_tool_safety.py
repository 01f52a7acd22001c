"""Issue 14: no lost work and no stuck checkout (export over hand edits, bump over megatron/ edits,
concurrent runs, stale git locks, failed materialize, corrupt state and journal, the review report)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools.bumpkit import (all_pass, assert_fresh_clone_report_is_the_committed_one, commit_checkout,
                                 ignore_generated, make_fork, quiet, replace_line, resolve_conflict, sh)
from tools.rebase.bump import journal
from tools.rebase.bump.bump import Stopped, bump, bump_abort, bump_continue
from tools.rebase.errors import RebaseError
from tools.rebase.stack.workrepo import apply, export

REPO_ROOT = Path(__file__).resolve().parents[2]
A, B = "megatron/core/alpha.py", "megatron/core/beta.py"
STACK = [
    ("keep-alpha", {A: replace_line("alpha line 10\n", "alpha line 10 fork\n")}),
    ("tweak-beta", {B: replace_line("beta line 5\n", "beta line 5 fork\n")}),
]


def cli(fork, *args, env=None):
    env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "tools.rebase", "-C", str(fork.root), *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True)


def upstream_v2(fork):
    """v2 rewrites the line tweak-beta changes: the bump stops there."""
    fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 upstream\n")}, "upstream: beta 5")
    sh("git", "tag", "v2", cwd=fork.upstream)


def stop_at_conflict(fork):
    with pytest.raises(Stopped):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=all_pass)


# ---------------------------------------------------------------- item 3: export and patches/

def test_export_refuses_untracked_patch_file_and_keeps_it(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    stray = fork.layout.patches / "0099-my-new-idea.patch"
    stray.write_text("a patch written by hand, not in the series yet\n")
    with pytest.raises(RebaseError, match=r"changed since the last apply or export.*0099-my-new-idea\.patch"):
        export(fork.layout, log=quiet)
    assert stray.read_text() == "a patch written by hand, not in the series yet\n"


def test_export_refuses_hand_edited_patch_file_and_keeps_the_edit(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    target = fork.layout.patches / "0002-tweak-beta.patch"
    edited = target.read_text().replace("Why it exists.", "Why it exists, explained better.")
    target.write_text(edited)
    with pytest.raises(RebaseError, match=r"0002-tweak-beta\.patch.*Run `python -m tools.rebase apply`"):
        export(fork.layout, log=quiet)
    assert target.read_text() == edited
    apply(fork.layout, log=quiet)  # the advised way: apply takes the edit into the work repo
    assert export(fork.layout, log=quiet) is False
    assert target.read_text() == edited


def test_export_replace_patches_writes_the_hand_rebuilt_work_repo(tmp_path, cache):
    # Patch files merged from two branches may not apply; the maintainer rebuilds the work repo by
    # hand from them and then has to be able to export over the merged files on purpose.
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    target = fork.layout.patches / "0002-tweak-beta.patch"
    exported = target.read_text()
    target.write_text(exported.replace("Why it exists.", "A merge of two branches' versions."))
    with pytest.raises(RebaseError, match=r"--replace-patches"):
        export(fork.layout, log=quiet)
    assert export(fork.layout, log=quiet, replace_patches=True) is True
    assert target.read_text() == exported
    assert export(fork.layout, log=quiet) is False   # the guard is armed again


# ---------------------------------------------------------------- item 4: bump and megatron/ edits

def test_bump_refuses_hand_edits_in_megatron_before_starting(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork)
    edited = fork.root / A
    edited.write_text(edited.read_text() + "# my experiment\n")
    before = fork.snapshot()
    with pytest.raises(RebaseError, match=r"megatron has local edits \(core/alpha\.py\); a bump would overwrite"):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=all_pass)
    assert edited.read_text().endswith("# my experiment\n")
    assert fork.snapshot() == before and not journal.in_progress(fork.layout)


def test_abort_keeps_megatron_edits_made_while_stopped(tmp_path, cache):
    """Edits in megatron/ made during a stop are not the bump's to discard: the tests refuse to
    overwrite them and abort leaves them."""
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork)
    stop_at_conflict(fork)
    resolve_conflict(fork.work, B, "beta line 5 both")
    edited = fork.root / A
    edited.write_text(edited.read_text() + "# made while stopped\n")
    with pytest.raises(RebaseError, match="tests of the bumped stack would overwrite them"):
        bump_continue(fork.layout, log=quiet, test_runner=all_pass)
    bump_abort(fork.layout, log=quiet)
    assert edited.read_text().endswith("# made while stopped\n")


# ---------------------------------------------------------------- item 5: one lock

def test_commands_refuse_while_another_holds_the_lock_naming_it(tmp_path, cache):
    from tools.rebase.git.lock import locked

    fork = make_fork(tmp_path)
    fork.stack(STACK)
    with locked(fork.layout, "apply"):
        for args in (["apply"], ["export"], ["bump", "--abort"], ["report"]):
            proc = cli(fork, *args, env={"FORK_REBASE_LOCK_WAIT": "0"})
            assert proc.returncode == 2, (args, proc.stderr)
            assert f"is held by pid {os.getpid()} (apply)" in proc.stderr, proc.stderr
    assert cli(fork, "apply").returncode == 0  # released


def test_lock_of_a_killed_run_does_not_block(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, sys.argv[1]); from pathlib import Path\n"
        "from tools.rebase.git.paths import Layout; from tools.rebase.git.lock import locked\n"
        "with locked(Layout(Path(sys.argv[2])), 'export'):\n    print('held', flush=True); time.sleep(60)\n"),
        str(REPO_ROOT), str(fork.root)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    proc = cli(fork, "export", env={"FORK_REBASE_LOCK_WAIT": "0"})
    assert proc.returncode == 2 and f"held by pid {holder.pid} (export)" in proc.stderr
    holder.kill()
    holder.wait()
    assert (fork.layout.state_dir / "lock").read_text().startswith(f"{holder.pid} ")  # left behind
    proc = cli(fork, "export", env={"FORK_REBASE_LOCK_WAIT": "0"})
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_apply_waits_for_the_lock_then_runs(tmp_path, cache):
    from tools.rebase.git.lock import locked

    fork = make_fork(tmp_path)
    fork.stack(STACK)
    shutil.rmtree(fork.root / "megatron")
    with locked(fork.layout, "export"):
        proc = subprocess.Popen([sys.executable, "-m", "tools.rebase", "-C", str(fork.root), "apply"],
                                cwd=REPO_ROOT, env=dict(os.environ, FORK_REBASE_LOCK_WAIT="60"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        assert not (fork.root / "megatron").exists()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (fork.root / A).is_file()


@pytest.mark.slow
def test_two_applies_at_once_both_end_with_a_whole_tree(tmp_path, cache):
    """The second apply starts while the first is inside its build (held there on purpose, so the
    two really overlap): it must wait rather than share the work repo, and both end whole."""
    from tools.rebase.stack.materialize import local_edits

    fork = make_fork(tmp_path)
    fork.stack(STACK)
    shutil.rmtree(fork.layout.work)
    shutil.rmtree(fork.root / "megatron")
    fork.layout.state_file.unlink()
    first = subprocess.Popen([sys.executable, "-c", (
        "import sys\nfrom tools.rebase.stack import workrepo\nfrom tools.rebase.launch import main\n"
        "real = workrepo.build\n"
        "def paused(*a, **k):\n    print('building', flush=True); sys.stdin.readline(); return real(*a, **k)\n"
        "workrepo.build = paused\nsys.exit(main(['-C', sys.argv[1], 'apply']))\n"), str(fork.root)],
        cwd=REPO_ROOT, env=os.environ, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    assert first.stdout.readline().strip() == "building"
    second = subprocess.Popen([sys.executable, "-m", "tools.rebase", "-C", str(fork.root), "apply"],
                              cwd=REPO_ROOT, env=dict(os.environ, FORK_REBASE_LOCK_WAIT="60"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with pytest.raises(subprocess.TimeoutExpired):  # it waits for the first one's lock
        second.wait(timeout=3)
    assert not (fork.root / "megatron").exists()
    outs = [first.communicate("\n", timeout=60) + (first.returncode,), second.communicate(timeout=60)
            + (second.returncode,)]
    assert [rc for _, _, rc in outs] == [0, 0], outs
    assert local_edits(fork.root / "megatron") == []
    assert "alpha line 10 fork" in (fork.root / A).read_text()
    assert "beta line 5 fork" in (fork.root / B).read_text()
    assert sorted(p.name for p in fork.root.iterdir() if p.name.startswith("megatron")) == ["megatron"]
    assert sh("git", "status", "--porcelain", cwd=fork.work) == ""


# ---------------------------------------------------------------- item 9: stale git locks

def test_stale_index_lock_does_not_block_continue_or_abort(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork)
    before = fork.snapshot()
    stop_at_conflict(fork)
    resolve_conflict(fork.work, B, "beta line 5 both")
    lock = fork.work / ".git" / "index.lock"
    lock.write_text("")  # what a git killed while it held the index leaves
    shell = subprocess.Popen(["sleep", "60"], cwd=fork.work)  # e.g. the maintainer's shell: no reason to wait
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'a'); "
                                "print('open', flush=True); time.sleep(60)", str(lock)], stdout=subprocess.PIPE)
    assert sleeper.stdout.readline().strip() == b"open"  # a live process holding the lock, like a running git
    try:
        with pytest.raises(RebaseError, match=rf"index\.lock.*live process.*pid {sleeper.pid}"):
            bump_abort(fork.layout, log=quiet)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert lock.exists()
    try:
        with pytest.raises(Stopped):  # continue clears the stale lock (the tests then fail on purpose)
            bump_continue(fork.layout, log=quiet, test_runner=lambda l, n, ids: {i: "failed" for i in ids})
    finally:
        shell.kill()
        shell.wait()
    lock.write_text("")
    (fork.work / ".git" / "refs" / "heads" / "patched.lock").write_text("")
    bump_abort(fork.layout, log=quiet)
    assert fork.snapshot() == before and not lock.exists()


# ---------------------------------------------------------------- item 10: failed materialize

def test_failed_materialize_leaves_the_work_branch_and_state_alone(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    head = sh("git", "rev-parse", "HEAD", cwd=fork.work)
    state = fork.layout.state_file.read_bytes()
    (fork.root / A).write_text((fork.root / A).read_text() + "# local\n")
    series = fork.layout.series.read_text()
    fork.layout.series.write_text(series.replace("0002-tweak-beta.patch\n", ""))  # drop a patch
    with pytest.raises(RebaseError, match="local edits"):
        apply(fork.layout, log=quiet)
    assert sh("git", "rev-parse", "HEAD", cwd=fork.work) == head
    assert sh("git", "symbolic-ref", "HEAD", cwd=fork.work).strip() == "refs/heads/patched"
    assert fork.layout.state_file.read_bytes() == state
    # Changing one's mind is safe: restore the series, and export (the tool's advice) loses nothing.
    fork.layout.series.write_text(series)
    before = fork.patch_files()
    (fork.root / A).write_text((fork.root / A).read_text().replace("# local\n", ""))
    export(fork.layout, log=quiet)
    assert fork.patch_files() == before


# ---------------------------------------------------------------- item 12: corrupt state and journal

def test_corrupt_state_is_an_error_not_no_state(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    fork.add_patch("unexported", {A: replace_line("alpha line 20\n", "alpha line 20 wip\n")})
    fork.layout.state_file.write_text('{"tip": ')
    for operation in (apply, export):
        with pytest.raises(RebaseError, match=r"state\.json is corrupt"):
            operation(fork.layout, log=quiet)
    fork.layout.state_file.write_text('["not", "an", "object"]')
    with pytest.raises(RebaseError, match=r"state\.json is corrupt: not a JSON object"):
        apply(fork.layout, log=quiet)
    assert "unexported" in sh("git", "log", "-1", "--format=%B", cwd=fork.work)  # the guard held
    apply(fork.layout, force=True, log=quiet)  # the way out it names


def test_corrupt_journal_continue_refuses_and_abort_restores_from_backup(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork)
    before = fork.snapshot()
    stop_at_conflict(fork)
    path = journal.journal_path(fork.layout)
    data = json.loads(path.read_text())
    data["phase"] = "sideways"
    path.write_text(json.dumps(data))
    with pytest.raises(RebaseError, match=r"journal is corrupt \(phase 'sideways' is not one of .*bump --abort"):
        bump_continue(fork.layout, log=quiet, test_runner=all_pass)
    path.write_text("{ truncated")
    with pytest.raises(RebaseError, match="journal is corrupt"):
        bump_continue(fork.layout, log=quiet)
    logged = []
    bump_abort(fork.layout, log=logged.append)
    assert fork.snapshot() == before
    assert any("journal is corrupt" in line for line in logged)
    assert not journal.in_progress(fork.layout)


# ---------------------------------------------------------------- Also: the review report

def test_plain_report_regenerates_the_committed_report_on_a_fresh_clone(tmp_path, cache):
    fork = make_fork(tmp_path)
    ignore_generated(fork)
    fork.stack(STACK)
    commit_checkout(fork, "stack on v1")
    upstream_v2(fork)
    stop_at_conflict(fork)
    resolve_conflict(fork.work, B, "beta line 5 both")
    bump_continue(fork.layout, log=quiet, test_runner=all_pass)
    commit_checkout(fork, "bump to v2")
    assert_fresh_clone_report_is_the_committed_one(fork, tmp_path)
    assert "conflict resolved by hand" in fork.layout.report_md.read_text()


def test_report_old_never_overwrites_the_review_report(tmp_path, cache):
    fork = make_fork(tmp_path)
    ignore_generated(fork)
    fork.stack(STACK)
    fork.layout.report_md.write_text("the review report\n")
    fork.layout.report_json.write_text("{}\n")
    commit_checkout(fork, "state 1")
    proc = cli(fork, "report", "--old", "HEAD")
    assert proc.returncode == 0, proc.stderr
    assert "identical" in proc.stdout  # the comparison goes to stdout
    for args in (["--output", str(fork.layout.report_md)], ["--output", str(tmp_path / "x.md"),
                                                            "--json", str(fork.layout.report_json)]):
        proc = cli(fork, "report", "--old", "HEAD", *args)
        assert proc.returncode == 2 and "review report" in proc.stderr, proc.stderr
    assert fork.layout.report_md.read_text() == "the review report\n"
    assert fork.layout.report_json.read_text() == "{}\n"


# ---------------------------------------------------------------- item 6: recorded resolutions

def _stored(fork):
    store = fork.layout.resolutions
    return {p.relative_to(store).as_posix(): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


def test_abort_and_retry_still_exports_the_resolution(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork)
    stop_at_conflict(fork)
    bump_abort(fork.layout, log=quiet)
    stop_at_conflict(fork)  # the same conflict again, after an abort
    resolve_conflict(fork.work, B, "beta line 5 both")
    bump_continue(fork.layout, log=quiet, test_runner=all_pass)
    stored = _stored(fork)
    assert sorted(k.split("/", 2)[2] for k in stored) == ["postimage", "preimage"], stored
    assert any(b"beta line 5 both" in v for k, v in stored.items() if k.endswith("postimage"))


def test_abort_forgets_resolutions_that_were_never_exported(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork)
    stop_at_conflict(fork)
    resolve_conflict(fork.work, B, "beta line 5 both")
    with pytest.raises(Stopped, match="tests fail on the bumped stack"):
        bump_continue(fork.layout, log=quiet, test_runner=lambda l, n, ids: {i: "failed" for i in ids})
    bump_abort(fork.layout, log=quiet)
    assert not fork.layout.resolutions.exists()
    # A fresh clone would stop at this conflict, so this machine must stop too.
    stop_at_conflict(fork)


def test_every_resolution_the_bump_used_is_exported(tmp_path, cache):
    """A stale rerere preimage (a killed run, a cache from before) makes git store the resolution as
    a variant (MERGE_RR names it ``<id>.1``): it must be exported all the same."""
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork)
    stop_at_conflict(fork)
    merge_rr = (fork.work / ".git" / "MERGE_RR").read_bytes()
    rid = merge_rr.split(b"\t")[0].decode()
    entry = fork.work / ".git" / "rr-cache" / rid
    (entry / "preimage.1").write_bytes((entry / "preimage").read_bytes())
    (entry / "preimage").write_text("a stale preimage of another conflict with this hash\n")
    (fork.work / ".git" / "MERGE_RR").write_bytes(merge_rr.replace(rid.encode(), f"{rid}.1".encode(), 1))
    data = json.loads(journal.journal_path(fork.layout).read_text())
    data["stopped"]["rerere_ids"] = [f"{rid}.1"]
    journal.journal_path(fork.layout).write_text(json.dumps(data))
    resolve_conflict(fork.work, B, "beta line 5 both")
    bump_continue(fork.layout, log=quiet, test_runner=all_pass)
    stored = _stored(fork)
    assert sorted(stored) == [f"tweak-beta/{rid}/postimage", f"tweak-beta/{rid}/preimage"], stored
    assert b"beta line 5 both" in stored[f"tweak-beta/{rid}/postimage"]
