"""The bump's background reads (tools/rebase/git/prefetch.py): only immutable queries are started, a
result is handed to exactly one caller, a failed one is re-run by its caller, and a bump gives
byte-identical patches and report with and without them."""

import threading

from tests.tools.bumpkit import make_fork, quiet
from tests.tools.bump.test_bump import STACK, passing, upstream_v2
from tools.rebase.git import prefetch
from tools.rebase.bump.bump import bump
from tools.rebase.analysis.diffparse import prefetch_range, read_range
from tools.rebase.stack.state import read_state

FULL = "a" * 40


def test_a_prefetched_result_is_taken_once_and_a_failure_is_left_to_the_caller():
    calls = []
    release = threading.Event()

    def slow(value):
        release.wait(5)
        calls.append(value)
        return value * 2

    prefetch.start(("t", FULL, 1), slow, 21)
    prefetch.start(("t", FULL, 1), slow, 99)  # same key while running: not started twice
    release.set()
    assert prefetch.take(("t", FULL, 1)) == (True, 42)
    assert prefetch.take(("t", FULL, 1)) == (False, None)
    assert calls == [21]

    def broken():
        raise OSError("git vanished")

    prefetch.start(("t", FULL, 2), broken)
    assert prefetch.take(("t", FULL, 2)) == (False, None)


def test_only_ranges_between_full_commit_ids_are_prefetched(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    state = read_state(fork.layout)
    base, tip = state["base"], state["tip"]
    prefetch_range(fork.work, base, "HEAD")  # a movable name: never prefetched
    assert ("log", str(fork.work), base, "HEAD") not in prefetch._slots
    expected = read_range(fork.work, base, tip)
    prefetch_range(fork.work, base, tip)
    assert ("log", str(fork.work), base, tip) in prefetch._slots
    assert read_range(fork.work, base, tip) == expected
    assert ("log", str(fork.work), base, tip) not in prefetch._slots


def _bumped(root, monkeypatch, prefetching):
    """Bump a fresh synthetic fork onto v2; return (patch files, report rows, prefetched queries used)."""
    taken = []
    with monkeypatch.context() as m:
        m.setenv("FORK_REBASE_CACHE", str(root / "cache"))
        if not prefetching:
            m.setattr(prefetch, "start", lambda *a, **k: None)
        real_take = prefetch.take

        def take(key):
            found, result = real_take(key)
            if found:
                taken.append(key[0])
            return found, result

        m.setattr(prefetch, "take", take)
        fork = make_fork(root)
        fork.stack(STACK)
        upstream_v2(fork)
        data = bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=passing)
    rows = [(r["status"], [c["subject"] for c in r["old"]], [c["subject"] for c in r["new"]])
            for r in data["mapping"]]
    left = [key for key in prefetch._slots if key[1] == str(fork.work)]
    assert not left, "every query the bump started was taken"
    return fork.patch_files(), rows, sorted(taken)


def test_a_bump_writes_the_same_patches_and_report_with_and_without_prefetching(tmp_path, monkeypatch):
    on = _bumped(tmp_path / "on", monkeypatch, prefetching=True)
    off = _bumped(tmp_path / "off", monkeypatch, prefetching=False)
    assert on[2] == ["format-patch", "log", "log", "range-diff"] and off[2] == []
    assert on[0] == off[0] and on[1] == off[1]
    assert {status for status, _, _ in on[1]} >= {"absorbed", "refreshed"}
