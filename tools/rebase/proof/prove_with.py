"""The other half of a proof: every patch's ``Tests:`` pass *with* the whole stack.

``prove`` once only checked that a patch's tests fail without it; a patch whose tests also fail
with it was "proven" (15/15 on a broken base). Here the tests of the chosen patches run once on
the whole stack, split over ``--jobs`` pytest processes (the files of a test module stay
together), results reused from ``testcache`` when the stack and tests are unchanged. A failing
test is run again on the pristine base to tell whose fault it is (``failures.py``). The bump's
finishing gate uses the same pieces on the bumped tree.
"""

from dataclasses import dataclass, field

from tools.rebase.proof.failures import UPSTREAM, classify, explain
from tools.rebase.proof.parallel import run_groups


@dataclass
class WithStack:
    results: dict = field(default_factory=dict)  # node id -> (outcome, message)
    kinds: dict = field(default_factory=dict)  # failing node id -> UPSTREAM or STACK
    culprits: dict = field(default_factory=dict)  # failing node id -> failures.culprit() or None
    reused: int = 0  # results taken from the cache

    def failing(self, node_ids) -> list:
        return [t for t in node_ids if self.results.get(t, ("", ""))[0].startswith("failed")]

    def notes(self, node_ids) -> list:
        """One explanation per failing test of ``node_ids``."""
        return [explain(t, self.results[t][1] or self.results[t][0], self.kinds.get(t, ""), self.culprits.get(t))
                for t in self.failing(node_ids)]

    def upstream_only(self, node_ids) -> bool:
        failing = self.failing(node_ids)
        return bool(failing) and all(self.kinds.get(t) == UPSTREAM for t in failing)


def chunks(node_ids: list, jobs: int) -> list:
    """``node_ids`` in at most ``jobs`` lists of about equal size, each test file in one list."""
    by_file = {}
    for node in node_ids:
        by_file.setdefault(node.split("::")[0], []).append(node)
    out = [[] for _ in range(max(1, min(jobs, len(by_file))))]
    for nodes in sorted(by_file.values(), key=len, reverse=True):
        min(out, key=len).extend(nodes)
    return [c for c in out if c]


def run_with_stack(cache, node_ids: list, jobs: int, run_chunk, run_pristine, find_culprit) -> WithStack:
    """Outcomes of ``node_ids`` on the whole stack (``run_chunk(slot, ids)``, in parallel, cached
    results first), failures classified by a run on the pristine base (``run_pristine(ids)``) and
    upstream's named by ``find_culprit(message)``."""
    out = WithStack()
    cached = cache.get(node_ids) if cache is not None else {}
    out.reused = len(cached)
    todo = [n for n in node_ids if n not in cached]
    parts = chunks(todo, jobs) if todo else []
    fresh = {}
    for result in run_groups([1] * len(parts), lambda slot, group, _unit: run_chunk(slot, parts[group]), jobs):
        fresh.update(result[0])
    if cache is not None:
        cache.put(fresh)
    out.results = {**cached, **fresh}
    failing = out.failing(node_ids)
    if failing:
        out.kinds = classify({t: out.results[t] for t in failing}, run_pristine(failing))
        out.culprits = {t: find_culprit(out.results[t][1]) for t in failing if out.kinds[t] == UPSTREAM}
    return out
