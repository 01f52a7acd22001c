"""``--jobs J`` for ``prove`` and ``prove --mutants``: groups of units on J threads, one scratch
slot (repo + run directory) per thread, results handed back in input order.

A group is the work that shares one build (a patch: its proof, or its baseline then its mutants).
Its first unit runs before the others; :func:`run_groups` hands the rest out only when that first
result allows it (``go_on``). A thread keeps to its group while it has units left, takes the next
unstarted group after that, and only then helps the group with the most units left, so each
slot rebuilds as rarely as it can. The threads only wait on child processes (git, pytest): the
work runs in those, and every one of them is started through :data:`CHILDREN`, so an interrupted
run (SIGTERM, Ctrl-C) kills their whole process groups before the scratch directories go.
"""

import os
import signal
import subprocess
import threading

from tools.rebase.errors import RebaseError


class Cancelled(Exception):
    """Raised in a worker thread once the run was interrupted."""


class Children:
    """The child processes of the worker threads, each in a process group of its own."""

    def __init__(self):
        self._lock = threading.Lock()
        self._live = set()
        self.cancelled = threading.Event()
        self.threads = None  # OMP_NUM_THREADS for each child when several run at once

    def _env(self, env):
        if self.threads is None:
            return env
        env = dict(os.environ if env is None else env)
        env.setdefault("OMP_NUM_THREADS", str(self.threads))  # a user's own setting wins
        return env

    def run(self, cmd, **kwargs) -> subprocess.CompletedProcess:
        """``subprocess.run(cmd, capture_output=True, text=True, **kwargs)``, killable as a group."""
        if self.cancelled.is_set():
            raise Cancelled()
        kwargs["env"] = self._env(kwargs.get("env"))
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, **kwargs)
        with self._lock:
            self._live.add(proc)
        try:
            out, err = proc.communicate()
        except BaseException:  # the main thread interrupted while waiting (serial run)
            _kill_group(proc)
            proc.wait()
            raise
        finally:
            with self._lock:
                self._live.discard(proc)
        if self.cancelled.is_set():
            raise Cancelled()
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    def cancel(self) -> None:
        self.cancelled.set()
        with self._lock:
            live = list(self._live)
        for proc in live:
            _kill_group(proc)

    def reset(self, jobs: int = 1) -> None:
        """Before a run of ``jobs`` at once: each child gets its share of the CPUs for torch's
        threads (J pytest processes with a thread per CPU each would oversubscribe the machine J
        times over); one job keeps torch's default."""
        self.cancelled.clear()
        self.threads = max(1, _cpus() // jobs) if jobs > 1 else None


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # pytest's own children (spawned ranks) too
    except (ProcessLookupError, PermissionError):
        pass


CHILDREN = Children()


class _Plan:
    """Which unit a thread runs next (under one lock); see the module docstring."""

    def __init__(self, sizes: list):
        self.cond = threading.Condition()
        self.sizes = sizes
        self.next_unit = [0] * len(sizes)  # next unit index to hand out, per group
        self.open = [False] * len(sizes)  # the first unit finished and allowed the rest
        self.closed = [False] * len(sizes)  # no more units will be handed out
        self.running = [0] * len(sizes)
        self.results = [[None] * n for n in sizes]
        self.done = [False] * len(sizes)
        self.unstarted = 0
        self.error = None

    def _available(self, g: int) -> bool:
        return not self.closed[g] and self.next_unit[g] < self.sizes[g] and (
            self.next_unit[g] == 0 or self.open[g])

    def take(self, current):
        """``(group, unit)`` for a thread last in group ``current``; None when nothing is left."""
        with self.cond:
            while True:
                if self.error is not None or CHILDREN.cancelled.is_set():
                    return None
                pick = None
                if current is not None and self.next_unit[current] and self._available(current):
                    pick = current
                while pick is None and self.unstarted < len(self.sizes):
                    g, self.unstarted = self.unstarted, self.unstarted + 1
                    if self._available(g):
                        pick = g
                if pick is None:
                    helpable = [g for g in range(len(self.sizes)) if self._available(g)]
                    if helpable:
                        pick = max(helpable, key=lambda g: (self.sizes[g] - self.next_unit[g], -g))
                if pick is not None:
                    unit = self.next_unit[pick]
                    self.next_unit[pick] += 1
                    self.running[pick] += 1
                    return pick, unit
                if all(self.done):
                    return None
                self.cond.wait()

    def finish(self, g: int, unit: int, result, go_on) -> None:
        with self.cond:
            self.results[g][unit] = result
            self.running[g] -= 1
            if unit == 0:
                if go_on(result):
                    self.open[g] = True
                else:
                    self.closed[g] = True
            finished = self.next_unit[g] >= self.sizes[g] or self.closed[g]
            if finished and self.running[g] == 0:
                self.done[g] = True
            self.cond.notify_all()

    def fail(self, exc) -> None:
        with self.cond:
            if self.error is None:
                self.error = exc
            self.cond.notify_all()


def run_groups(sizes: list, work, jobs: int, go_on=lambda first: True, on_group=None) -> list:
    """Run ``work(slot, group, unit)`` for every unit of every group; return the results as
    ``[[result of unit 0, ...] per group]`` in input order (None for units never run).

    ``jobs`` threads, thread ``i`` always passing ``slot=i``; units after a group's first run
    only if ``go_on(first result)``. ``on_group(group, results)`` is called in the caller's
    thread in group order, each as soon as it and every group before it are done.
    """
    if jobs < 1:
        raise RebaseError(f"--jobs needs a count >= 1, got {jobs}")
    CHILDREN.reset(jobs)
    plan = _Plan(sizes)
    reported = 0

    def report_ready():
        nonlocal reported
        while reported < len(sizes) and plan.done[reported]:
            if on_group:
                on_group(reported, plan.results[reported])
            reported += 1

    if jobs == 1:  # in this thread: an interruption lands straight in the running child
        current = None
        while True:
            picked = plan.take(current)
            if picked is None:
                break
            current, unit = picked
            plan.finish(current, unit, work(0, current, unit), go_on)
            report_ready()
        return plan.results

    def worker(slot):
        current = None
        try:
            while True:
                picked = plan.take(current)
                if picked is None:
                    return
                current, unit = picked
                plan.finish(current, unit, work(slot, current, unit), go_on)
        except Cancelled:
            return
        except BaseException as exc:  # surfaces in the caller's thread
            plan.fail(exc)

    threads = [threading.Thread(target=worker, args=(i,), name=f"prove-slot-{i}", daemon=True)
               for i in range(min(jobs, max(1, sum(sizes))))]
    for t in threads:
        t.start()
    try:
        with plan.cond:
            while not all(plan.done) and plan.error is None:
                plan.cond.wait(timeout=1.0)  # a signal handler gets to run between waits
                plan.cond.release()
                try:
                    report_ready()
                finally:
                    plan.cond.acquire()
        if plan.error is not None:
            raise plan.error
        report_ready()
    except BaseException:
        CHILDREN.cancel()
        with plan.cond:
            plan.cond.notify_all()
        raise
    finally:
        for t in threads:
            t.join()
    return plan.results
