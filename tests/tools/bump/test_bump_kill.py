"""Kill a bump (SIGKILL) at every hook point and inside every git call that changes something, then
check that ``bump --abort`` restores everything exactly and that ``bump --continue`` reaches the
same pin, patches, resolutions and report as a bump nobody killed.

Two ways to kill: ``FORK_REBASE_KILL_AT=<point>`` (tools/rebase/bump/killpoints.py), and a fake ``git``
first on PATH that, at its n-th state-changing call, either takes ``index.lock`` and dies with the
bump before git runs (a git killed while holding the index), or lets git finish and then kills the
bump before it sees the result. Each world is a copy of one small synthetic fork, so a point costs
about a second.
"""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools.bumpkit import Fork, copy_with_markers, make_fork, quiet, replace_line, resolve_conflict, sh
from tools.rebase.bump import journal
from tools.rebase.bump.killpoints import KILL_ENV, POINTS
from tools.rebase.git.paths import Layout

REPO_ROOT = Path(__file__).resolve().parents[3]
A, B, G = "megatron/core/alpha.py", "megatron/core/beta.py", "megatron/core/gamma.py"
STACK = [
    ("keep-alpha", {A: replace_line("alpha line 10\n", "alpha line 10 fork\n")}),
    ("upstreamed", {G: replace_line("gamma line 20\n", "gamma line 20 fixed\n")}),
    ("tweak-beta", {B: replace_line("beta line 5\n", "beta line 5 fork\n")}),
    ("new-module", {"megatron/core/fork_extra.py": "EXTRA = 1\n"}),
]
WATCHED = ("rebase commit commit-tree reset checkout update-ref symbolic-ref tag fetch cherry-pick merge "
           "config clean add am worktree rerere init read-tree checkout-index")

FAKE_GIT = """#!/bin/sh
sub=""; skip=0
for a in "$@"; do
  if [ "$skip" = 1 ]; then skip=0; continue; fi
  case "$a" in -c|-C) skip=1 ;; -*) ;; *) sub="$a"; break ;; esac
done
case " $KILLGIT_WATCH " in
  *" $sub "*)
    n=$(cat "$KILLGIT_COUNT" 2>/dev/null || echo 0); n=$((n+1)); echo "$n" > "$KILLGIT_COUNT"
    if [ "$n" = "$KILLGIT_AT" ]; then
      if [ "$KILLGIT_MODE" = lock ]; then
        gitdir=$("{real}" rev-parse --absolute-git-dir 2>/dev/null) && : > "$gitdir/index.lock"
      else
        "{real}" "$@"
      fi
      kill -9 "$PPID"; exit 137
    fi ;;
esac
exec "{real}" "$@"
"""

RUN_BUMP = """
import sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from tools.rebase.bump.bump import bump, bump_continue
from tools.rebase.git.paths import Layout

def runner(layout, name, ids):
    text = (layout.root / "megatron/core/beta.py").read_text()
    return {{i: "passed" if "beta line 5 both" in text else "failed" for i in ids}}

layout = Layout(Path({root!r}))
if {cont!r}:
    bump_continue(layout, log=lambda *a: None, test_runner=runner)
else:
    bump(layout, {spec!r}, log=lambda *a: None, test_runner=runner)
"""


def runner(layout, name, ids):
    text = (layout.root / B).read_text()
    return {i: "passed" if "beta line 5 both" in text else "failed" for i in ids}


def upstream_v2(fork):
    fork.upstream_commit({A: replace_line("alpha line 12\n", "alpha line 12 upstream\n")}, "upstream: alpha 12")
    fork.upstream_commit({G: replace_line("gamma line 20\n", "gamma line 20 fixed\n")}, "upstream: take gamma")
    fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 upstream\n")}, "upstream: beta 5")
    sh("git", "tag", "v2", cwd=fork.upstream)


def state_of(root: Path) -> dict:
    """Everything abort must restore: checkout files, megatron/, tool state, work repo refs, HEAD,
    index, config and rerere cache."""
    fork = Fork(root, None)
    files, work = fork.snapshot()
    out = {"files": files, "work": work}
    for name in ("megatron", ".rebase/work/.git/rr-cache"):
        base = root / name
        out[name] = {p.relative_to(base).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                     for p in sorted(base.rglob("*")) if p.is_file()} if base.is_dir() else None
    out["index"] = sh("git", "ls-files", "-s", cwd=root / ".rebase" / "work")
    return out


def outcome_of(root: Path) -> dict:
    """What a finished bump produced: pin, patches/ (series, patch files, resolutions) and report."""
    out = {p.relative_to(root).as_posix(): p.read_bytes()
           for p in sorted((root / "patches").rglob("*")) if p.is_file()}
    for name in ("upstream.toml", "REBASE_REPORT.json", "REBASE_REPORT.md"):
        out[name] = (root / name).read_bytes()
    return out


class World:
    """A fork ready to bump (``stopped``: with the bump already stopped at its conflict and the
    conflict resolved, so ``--continue`` is what gets killed)."""

    def __init__(self, tmp: Path, stopped: bool):
        self.tmp, self.stopped = tmp, stopped
        self.cache = tmp / "cache"
        os.environ["FORK_REBASE_CACHE"] = str(self.cache)
        donor = make_fork(tmp, name="donor")
        donor.stack(STACK)
        upstream_v2(donor)
        self.spec = f"git:{donor.upstream}@v2"
        fork = make_fork(tmp, name="world")
        fork.stack(STACK)
        if not stopped:  # the resolution is recorded in patches/resolutions: the bump does not stop
            from tools.rebase.bump.bump import Stopped, bump, bump_continue

            with pytest.raises(Stopped):
                bump(donor.layout, self.spec, log=quiet, test_runner=runner)
            resolve_conflict(donor.work, B, "beta line 5 both")
            bump_continue(donor.layout, log=quiet, test_runner=runner)
            shutil.copytree(donor.layout.resolutions, fork.layout.resolutions)
            self.pre_bump = state_of(fork.root)  # what abort must restore
        else:
            from tools.rebase.bump.bump import Stopped, bump

            self.pre_bump = state_of(fork.root)
            with pytest.raises(Stopped):
                bump(fork.layout, self.spec, log=quiet, test_runner=runner)
            resolve_conflict(fork.work, B, "beta line 5 both")
        self.root = fork.root
        self.before = state_of(self.root)
        self.fake = tmp / "fakegit"
        self.fake.mkdir()
        (self.fake / "git").write_text(FAKE_GIT.replace("{real}", shutil.which("git")))
        (self.fake / "git").chmod(0o755)
        ref = self.copy("reference")
        proc = self.run(ref, count=tmp / "count-reference")
        assert proc.returncode == 0, proc.stderr
        self.reference = outcome_of(ref)
        self.git_calls = int((tmp / "count-reference").read_text())

    def copy(self, name: str) -> Path:
        """A private copy of the world (checkout with .rebase/ and the cache)."""
        dest = self.tmp / name
        copy_with_markers(self.root, dest / "world")
        copy_with_markers(self.cache, dest / "cache")
        return dest / "world"

    def run(self, root: Path, count: Path, kill_point="", git_at=0, mode=""):
        env = dict(os.environ, FORK_REBASE_CACHE=str(root.parent / "cache"), PATH=f"{self.fake}:{os.environ['PATH']}",
                   KILLGIT_WATCH=WATCHED, KILLGIT_COUNT=str(count), KILLGIT_AT=str(git_at), KILLGIT_MODE=mode)
        env[KILL_ENV] = kill_point
        script = RUN_BUMP.format(repo=str(REPO_ROOT), root=str(root), spec=self.spec, cont=self.stopped)
        return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)

    def check_kill(self, label: str, **kill):
        """Kill one run as asked; return (whether it was killed, the problems found)."""
        root = self.copy(label)
        proc = self.run(root, count=root.parent / "count", **kill)
        if proc.returncode != -9:
            shutil.rmtree(root.parent, ignore_errors=True)
            return False, ([] if proc.returncode == 0 else
                           [f"{label}: the bump failed instead (rc {proc.returncode}): {proc.stderr.strip()[-300:]}"])
        problems = []
        aborted = self.tmp / f"{label}-abort"
        copy_with_markers(root.parent, aborted)
        os.environ["FORK_REBASE_CACHE"] = str(aborted / "cache")
        from tools.rebase.bump.bump import bump, bump_abort, bump_continue

        layout = Layout(aborted / "world")
        if journal.in_progress(layout):
            try:
                bump_abort(layout, log=quiet)
                after = state_of(layout.root)
                if after != self.pre_bump:
                    diff = [k for k in after if after[k] != self.pre_bump[k]]
                    problems.append(f"{label}: abort did not restore the exact previous state ({diff})")
            except Exception as exc:  # noqa: BLE001  (collect every point's failure)
                problems.append(f"{label}: abort failed: {exc}")
        elif state_of(layout.root) != self.before:
            problems.append(f"{label}: killed before the journal existed, yet something changed")
        os.environ["FORK_REBASE_CACHE"] = str(root.parent / "cache")
        layout = Layout(root)
        try:
            if journal.in_progress(layout):
                bump_continue(layout, log=quiet, test_runner=runner)
            else:
                bump(layout, self.spec, log=quiet, test_runner=runner)
            got = outcome_of(root)
            if got != self.reference:
                diff = sorted(k for k in set(got) | set(self.reference) if got.get(k) != self.reference.get(k))
                problems.append(f"{label}: continue differs from the unkilled bump in {diff}")
            if state_of(root)["megatron"] != self.pre_bump["megatron"]:
                problems.append(f"{label}: megatron/ after the finished bump is not the tree the last apply built")
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{label}: continue failed: {exc}")
        shutil.rmtree(root.parent, ignore_errors=True)
        shutil.rmtree(aborted, ignore_errors=True)
        return True, problems


@pytest.fixture(scope="module", params=["onto", "continue"])
def world(request, tmp_path_factory):
    old = os.environ.get("FORK_REBASE_CACHE")
    try:
        yield World(tmp_path_factory.mktemp(f"kill-{request.param}"), stopped=request.param == "continue")
    finally:
        os.environ.pop("FORK_REBASE_CACHE", None) if old is None else os.environ.update(FORK_REBASE_CACHE=old)


@pytest.mark.slow
def test_kill_at_every_hook_point(world):
    problems, reached = [], []
    for point in POINTS:
        killed, found = world.check_kill(f"hook-{point}", kill_point=point)
        problems += found
        reached += [point] if killed else []
    assert not problems, "\n".join(problems)
    # The onto world replays, resolves by a recorded resolution, tests and finishes; the continue
    # world records a hand resolution first (after-backup/after-import belong to the start only).
    expected = set(POINTS) - ({"after-backup", "after-import"} if world.stopped else {"after-record"})
    assert set(reached) == expected


@pytest.mark.slow
def test_kill_inside_every_state_changing_git_call(world):
    assert world.git_calls > 5, world.git_calls
    problems = []
    for n in range(1, world.git_calls + 1):
        mode = "lock" if n % 2 else "after"
        killed, found = world.check_kill(f"git-{n}-{mode}", git_at=n, mode=mode)
        problems += found if killed else found + [f"git-{n}: the bump did not reach this call"]
    assert not problems, "\n".join(problems)
