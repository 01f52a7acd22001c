"""``run_groups``, the scheduler behind ``prove --jobs``: results in input order whatever the
thread count, a group's later units only after its first allows them, one slot per thread, and an
interrupted run that kills its children instead of waiting for them."""

import threading
import time

import pytest

from tools.rebase.errors import RebaseError
from tools.rebase.proof.parallel import CHILDREN, run_groups


def _alive(pid: int) -> bool:
    """Running (a killed orphan can stay a zombie until the container's init reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _work_log():
    seen, lock = [], threading.Lock()

    def work(slot, group, unit):
        time.sleep(0.01 * ((group * 7 + unit * 3) % 5))  # finish out of order
        with lock:
            seen.append((slot, group, unit, threading.current_thread().name))
        return (group, unit)

    return seen, work


@pytest.mark.parametrize("jobs", [1, 2, 5])
def test_results_and_reports_come_in_input_order(jobs):
    seen, work = _work_log()
    reported = []
    sizes = [3, 1, 4, 2, 1]
    results = run_groups(sizes, work, jobs, on_group=lambda g, r: reported.append((g, list(r))))
    expected = [[(g, u) for u in range(n)] for g, n in enumerate(sizes)]
    assert results == expected
    assert reported == list(enumerate(expected))
    assert sorted((g, u) for _, g, u, _ in seen) == sorted((g, u) for g, n in enumerate(sizes) for u in range(n))
    slots_by_thread = {}
    for slot, _, _, thread in seen:
        slots_by_thread.setdefault(thread, set()).add(slot)
    assert all(len(s) == 1 for s in slots_by_thread.values()), "a thread always gets the same slot"
    assert {s for _, _, _, t in seen for s in slots_by_thread[t]} <= set(range(jobs))


@pytest.mark.parametrize("jobs", [1, 3])
def test_a_refused_first_unit_stops_its_group_only(jobs):
    seen, work = _work_log()
    results = run_groups([3, 3, 2], work, jobs, go_on=lambda first: first[0] != 1)
    assert results == [[(0, 0), (0, 1), (0, 2)], [(1, 0), None, None], [(2, 0), (2, 1)]]
    assert not any(g == 1 and u > 0 for _, g, u, _ in seen)


def test_later_units_never_start_before_the_first_finishes():
    order, lock = [], threading.Lock()

    def work(slot, group, unit):
        with lock:
            order.append(("start", unit))
        if unit == 0:
            time.sleep(0.2)
        with lock:
            order.append(("end", unit))
        return unit

    run_groups([4], work, 4)
    assert order.index(("end", 0)) < min(order.index(("start", u)) for u in (1, 2, 3))


def test_a_worker_error_reaches_the_caller():
    def work(slot, group, unit):
        if group == 2:
            raise RebaseError("group two is broken")
        return group

    with pytest.raises(RebaseError, match="group two is broken"):
        run_groups([1] * 4, work, 2)
    with pytest.raises(RebaseError, match="--jobs needs a count >= 1, got 0"):
        run_groups([1], work, 0)


def test_an_interrupted_run_kills_the_children_it_started(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()

    def work(slot, group, unit):
        if group == 0:
            return "quick"
        # a child that would outlive the test, with a grandchild of its own
        CHILDREN.run(["sh", "-c", f"sleep 60 & echo $! > {pids}/{group}; wait"])
        return "never"

    def interrupt(group, results):
        time.sleep(0.5)  # the other groups' children are running by now
        raise KeyboardInterrupt

    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_groups([1, 1, 1], work, 3, on_group=interrupt)
    assert time.monotonic() - began < 20, "the run waited for its children instead of killing them"
    grandchildren = [int(p.read_text()) for p in pids.iterdir()]
    assert grandchildren, "the children never started"
    time.sleep(0.2)
    assert [pid for pid in grandchildren if _alive(pid)] == []
    # the next run starts clean
    assert run_groups([1], lambda s, g, u: "ok", 2) == [["ok"]]


def test_parallel_children_share_the_cpus_and_a_users_setting_wins(monkeypatch):
    from tools.rebase.proof import parallel

    monkeypatch.setattr(parallel, "_cpus", lambda: 16)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    def threads(slot, group, unit):
        return CHILDREN.run(["sh", "-c", "echo ${OMP_NUM_THREADS:-unset}"]).stdout.strip()

    assert run_groups([1, 1], threads, 4) == [["4"], ["4"]]
    assert run_groups([1], threads, 1) == [["unset"]], "one job keeps torch's default"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert run_groups([1], threads, 4) == [["3"]]
