"""Why a patch's test fails with the whole stack: upstream's base broke it, or the stack did.

A bump onto a broken upstream state finished green once: 112 tests failed on the finished line,
all with one NameError that the new base itself raised. Telling the two apart is per failing
test: it is run again on the pristine base (no patch); when it fails there too with the same
error class, the base broke it ("upstream"), else the fork's stack or its resolution did
("stack"). A test that cannot even run on the pristine base (it tests a fork feature, so it fails
there with another error, usually an ImportError) is the stack's. A failed assertion on both says
nothing about upstream (without the patch the feature is simply missing): it is the stack's when
the stack changed what the assertion saw (another message), else "unclear", which stops a bump
like the stack's. For an upstream failure the
upstream commit that last added or removed the name in the error (``git log -S``, pickaxe) is
named when the base has history.
"""

import re

from tools.rebase.git.gitcmd import git_proc

UPSTREAM, STACK, UNCLEAR = "upstream", "stack", "unclear"

_CLASS = re.compile(r"\b((?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning))\b")
# The name an error is about: NameError, ImportError, AttributeError, ModuleNotFoundError, KeyError.
_SYMBOL = (
    re.compile(r"name '([A-Za-z_]\w*)' is not defined"),
    re.compile(r"cannot import name '([A-Za-z_]\w*)'"),
    re.compile(r"has no attribute '([A-Za-z_]\w*)'"),
    re.compile(r"No module named '([\w.]+)'"),
    re.compile(r"unexpected keyword argument '([A-Za-z_]\w*)'"),
    re.compile(r"missing \d+ required positional arguments?: '([A-Za-z_]\w*)'"),
)


def error_class(message: str) -> str:
    """The exception class a failure message names ("NameError", "AssertionError"), or ""."""
    message = (message or "").strip()
    if message.startswith("assert ") or message == "assert":
        return "AssertionError"
    m = _CLASS.search(message)
    return m[1].rsplit(".", 1)[-1] if m else ""


def symbol_of(message: str):
    """The name a failure is about (to search upstream's history for), else None."""
    for pattern in _SYMBOL:
        m = pattern.search(message or "")
        if m:
            return m[1].rsplit(".", 1)[-1]
    return None


def classify(with_stack: dict, pristine: dict) -> dict:
    """``{test: UPSTREAM or STACK}`` for the tests that failed with the stack (``with_stack``:
    ``{test: (outcome, message)}``), from their outcomes on the pristine base (same shape)."""
    out = {}
    for test, (outcome, message) in with_stack.items():
        if not outcome.startswith("failed"):
            continue
        base_outcome, base_message = pristine.get(test, ("not run", ""))
        kind = error_class(message)
        if not base_outcome.startswith("failed") or error_class(base_message) != kind or not kind:
            out[test] = STACK
        elif kind != "AssertionError":
            out[test] = UPSTREAM
        else:  # the stack changed what the assertion saw and it still fails: the stack's
            out[test] = UNCLEAR if base_message.strip() == message.strip() else STACK
    return out


def culprit(repo, message: str, newest: str, oldest: str = "") -> dict | None:
    """``{"commit", "subject", "symbol"}`` of the last upstream commit (``oldest..newest``, or the
    history of ``newest``) that added or removed the name the failure is about, else None."""
    symbol = symbol_of(message)
    if not symbol or not newest:
        return None
    revs = f"{oldest}..{newest}" if oldest else newest
    proc = git_proc("log", "-1", "--no-merges", "--format=%H %s", f"-S{symbol}", revs, "--", "megatron", cwd=repo)
    line = proc.stdout.strip() if proc.returncode == 0 else ""
    if not line:
        return None
    return {"commit": line[:40], "subject": line[41:], "symbol": symbol}


def explain(test: str, message: str, kind: str, found) -> str:
    """One line for a failing test: whose fault, the error, and the upstream commit if found."""
    if kind == UPSTREAM:
        where = (f"; upstream {found['commit'][:12]} ({found['subject']}) last changed {found['symbol']!r}"
                 if found else "")
        return f"{test}: fails on the pristine new base too (upstream broke it): {message}{where}"
    if kind == UNCLEAR:
        return (f"{test}: fails with the stack and on the pristine base, both a failed assertion (which "
                f"cannot tell whether upstream or the stack broke it): {message}")
    return f"{test}: fails only with the stack (a patch or its resolution broke it): {message}"
