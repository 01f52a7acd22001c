"""Named points where a bump can be killed on purpose, to prove it can be continued or aborted.

``bump`` calls ``hook(point)`` after each step it journals. The default hook does nothing unless
``FORK_REBASE_KILL_AT=<point>[#<n>]`` is set, then it SIGKILLs the process at the n-th time (default
the first) it reaches that point: the kill test (tests/tools/test_bump_kill.py) drives the CLI this
way. Nothing else reads the variable.
"""

import os
import signal

KILL_ENV = "FORK_REBASE_KILL_AT"
POINTS = ("after-backup", "after-import", "after-rebase", "after-pick", "after-record", "after-tests",
          "after-pin", "after-export", "after-report", "after-package-restore")
_seen = {}


def env_hook(point: str, **info) -> None:
    wanted = os.environ.get(KILL_ENV, "")
    if not wanted:
        return
    name, _, nth = wanted.partition("#")
    if name != point:
        return
    _seen[point] = _seen.get(point, 0) + 1
    if _seen[point] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
