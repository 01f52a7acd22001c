"""Start read-only git queries early, in background threads, and hand their results to the
first caller that asks for exactly the same query.

A bump spends most of its time in git processes, one after another, on a 2-core laptop as much
as in CI. Some of them only read commits that can no longer change (ranges between full commit
ids): the report's logs and range-diff, the export's format-patch. Starting those while the
bump is still linting or backing up lets the other core run them. Only queries whose arguments
are full commit ids are prefetched, so a result can never be stale; a query nobody takes is
simply dropped, and a failed one is run again by its caller, which reports the error.
"""

import threading

from tools.rebase.git.gitcmd import is_full_id

_slots = {}  # key -> [thread, result, ok]
_lock = threading.Lock()


def immutable(*revs: str) -> bool:
    """Whether every revision is a full commit id (what it names can never change)."""
    return all(is_full_id(r) for r in revs)


def start(key: tuple, fn, *args) -> None:
    """Run ``fn(*args)`` in a background thread; ``take(key)`` returns its result."""
    slot = [None, None, False]

    def run():
        try:
            slot[1], slot[2] = fn(*args), True
        except Exception:  # noqa: BLE001 - the caller runs the query itself and reports the error
            slot[2] = False

    with _lock:
        if key in _slots:
            return
        _slots[key] = slot
        slot[0] = threading.Thread(target=run, name=f"prefetch-{key[0]}")
    slot[0].start()


def take(key: tuple):
    """``(True, result)`` of a prefetched query (waiting for it), else ``(False, None)``."""
    with _lock:
        slot = _slots.pop(key, None)
    if slot is None:
        return False, None
    slot[0].join()
    return (True, slot[1]) if slot[2] else (False, None)
