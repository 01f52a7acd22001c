"""Run a patch's ``Tests:`` node ids with pytest and give each one outcome.

A test that could not run says nothing about the patch: a conftest that fails to import, a module
the environment lacks (torch), pytest's "usage error" (exit 4) or "no tests collected" (exit 5)
become ``could not run: <error>``, never ``failed``, so nobody is told to fix a patch for a broken
environment. A test file whose import fails in the code under test (a NameError, a name
``megatron`` no longer defines) is ``failed``: that is the stack or its base, not the environment.
"""

import re
import subprocess
import sys
import tempfile

from tools.rebase.proof.isolation import isolated_env
from tools.rebase.proof.testids import invalid_test_id

COULD_NOT_RUN = "could not run"
_VERBOSE_LINE = re.compile(r"^(tests/\S+?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_COLLECT_ERROR = re.compile(r"^ERROR (\S+?)(?:::\S+)?(?: - (.+))?$")
_SECTION = re.compile(r"^_+ ERROR collecting (\S+) _+$")
_E_LINE = re.compile(r"^E\s+(\S.*)$")
_FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (\S+?) - (.+)$")


def _first_error(text: str) -> str:
    for line in text.splitlines():
        m = _E_LINE.match(line)
        if m and re.match(r"^[\w.]+(Error|Exception)\b", m[1]):
            return m[1].strip()
    for line in text.splitlines():
        if "while loading conftest" in line or line.startswith("ERROR:"):
            return line.strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


# Errors at import that say the code under test is broken (a base that renamed a class the stack
# imports), not that the environment lacks something.
_BROKEN_CODE = re.compile(r"^(NameError|AttributeError|SyntaxError|IndentationError|TypeError)\b"
                          r"|^ImportError: cannot import name .* from '?megatron\b"
                          r"|^ModuleNotFoundError: No module named 'megatron\b")


def _code_under_test_broke(error: str) -> bool:
    return bool(_BROKEN_CODE.search(error.strip()))


def is_under(test: str, node: str) -> bool:
    """``test`` is the node id ``node`` or one pytest collects under it (a directory, file or class)."""
    return test == node or test.startswith((node + "::", node + "[", node.rstrip("/") + "/"))


def run_pytest(root, node_ids: list, messages=None) -> dict:
    """``{node id: outcome}``: passed, failed, skipped, not found, or could not run: <error>.
    ``messages`` (a dict) is given the one-line message of each failed node id."""
    # "--" ends options, but pytest loads a "-p NAME" plugin even after it: refuse such ids here too.
    refused = {n: f"refused: {invalid_test_id(n)}" for n in node_ids if invalid_test_id(n)}
    if refused:
        return {**refused, **run_pytest(root, [n for n in node_ids if n not in refused], messages)}
    if not node_ids:
        return {}
    with tempfile.TemporaryDirectory(prefix="fork-isolation-") as shim:  # root's megatron only
        proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--no-header", "-rfE",
                               "--continue-on-collection-errors", "--", *node_ids],  # "--": an id is never an option
                              cwd=root, env=isolated_env(root, shim, COLUMNS="1000"),  # untruncated summaries
                              capture_output=True, text=True)
    text = proc.stdout + "\n" + proc.stderr
    if proc.returncode == 4 and len(node_ids) > 1:  # a bad node id stops the whole run: go one by one
        out = {}
        for node in node_ids:
            out.update(run_pytest(root, [node], messages))
        return out
    ran = [m.groups() for m in map(_VERBOSE_LINE.match, proc.stdout.splitlines()) if m]
    broken = {}  # file -> collection error ("ERROR collecting <file>" section, first E line)
    section = None
    for line in proc.stdout.splitlines():
        m = _SECTION.match(line)
        if m:
            section = m[1]
            continue
        m = _E_LINE.match(line)
        if m and section and section not in broken:
            broken[section] = m[1].strip()
        m = _COLLECT_ERROR.match(line)
        if m and m[1] not in broken:
            broken[m[1]] = (m[2] or "collection error").strip()
    broken = {path: err for path, err in broken.items()
              if not any(t == path or t.startswith(path + "::") for t, _ in ran)}
    results = {}
    for node in node_ids:
        mine = [outcome for test, outcome in ran if is_under(test, node)]
        failed_to_collect = next((err for path, err in broken.items()
                                  if is_under(path, node.split("::")[0]) or is_under(node, path)), None)
        if failed_to_collect and not mine and _code_under_test_broke(failed_to_collect):
            results[node] = "failed"
            if messages is not None:
                messages[node] = failed_to_collect
        elif failed_to_collect and not mine:
            results[node] = f"{COULD_NOT_RUN}: {failed_to_collect}"
        elif any(o in ("FAILED", "ERROR", "XPASS") for o in mine):
            results[node] = "failed"
            if messages is not None:
                said = [m[2] for m in map(_FAILED_LINE.match, proc.stdout.splitlines()) if m and is_under(m[1], node)]
                messages[node] = said[0].strip() if said else ""
        elif mine and all(o == "SKIPPED" for o in mine):
            results[node] = "skipped"
        elif mine:
            results[node] = "passed"
        elif proc.returncode == 4 and "not found" in text and "while loading conftest" not in text:
            results[node] = "not found"
        elif proc.returncode == 5:
            results[node] = f"{COULD_NOT_RUN}: pytest collected no tests (exit 5)"
        elif proc.returncode in (2, 3, 4):
            results[node] = f"{COULD_NOT_RUN}: {_first_error(text)} (pytest exit {proc.returncode})"
        else:
            results[node] = "not found"
    return results
