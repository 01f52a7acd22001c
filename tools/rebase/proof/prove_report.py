"""A pytest plugin for ``prove``: write each test's outcome, and each file that failed to collect,
to the JSON file named by ``FORK_PROVE_REPORT`` (a file whose import fails without the patch
counts as a failure, which pytest's exit code alone cannot tell from an unknown node id)."""

import json
import os

_outcomes = {}
_collect_errors = []


def pytest_collectreport(report):
    if report.failed:
        _collect_errors.append(report.nodeid)


def pytest_runtest_logreport(report):
    if report.failed:
        _outcomes[report.nodeid] = "failed"
    elif report.skipped and report.nodeid not in _outcomes:
        _outcomes[report.nodeid] = "skipped"
    elif report.when == "call" and report.passed and report.nodeid not in _outcomes:
        _outcomes[report.nodeid] = "passed"


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("FORK_PROVE_REPORT")
    if path:
        with open(path, "w") as fh:
            json.dump({"outcomes": _outcomes, "collect_errors": _collect_errors}, fh)
