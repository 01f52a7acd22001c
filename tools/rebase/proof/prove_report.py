"""A pytest plugin for ``prove``: write each test's outcome, and each file that failed to collect,
to the JSON file named by ``FORK_PROVE_REPORT`` (a file whose import fails without the patch
counts as a failure, which pytest's exit code alone cannot tell from an unknown node id), with
each failure's one-line message (to tell upstream's breakage from the stack's: failures.py)."""

import json
import os

_outcomes = {}
_collect_errors = []
_messages = {}  # node id -> the failure's one-line message ("NameError: name 'x' is not defined")


def _message(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return str(crash.message).splitlines()[0] if str(crash.message) else ""
    lines = [line[1:].strip() for line in str(report.longrepr).splitlines() if line.startswith("E ")]
    return lines[-1] if lines else (str(report.longrepr).strip().splitlines() or [""])[-1]


def pytest_collectreport(report):
    if report.failed:
        _collect_errors.append(report.nodeid)
        _messages.setdefault(report.nodeid, _message(report))


def pytest_runtest_logreport(report):
    if report.failed:
        _outcomes[report.nodeid] = "failed"
        _messages.setdefault(report.nodeid, _message(report))
    elif report.skipped and report.nodeid not in _outcomes:
        _outcomes[report.nodeid] = "skipped"
    elif report.when == "call" and report.passed and report.nodeid not in _outcomes:
        _outcomes[report.nodeid] = "passed"


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("FORK_PROVE_REPORT")
    if path:
        with open(path, "w") as fh:
            json.dump({"outcomes": _outcomes, "collect_errors": _collect_errors, "messages": _messages}, fh)
