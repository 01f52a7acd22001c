"""Issue 46, Low items: the committed records are data. A deeply nested or non-UTF-8
``proof.json`` or ``mutants-equivalent.toml`` is an error naming the file, never a traceback; a
``proof.json`` or ``mutants-equivalent.toml`` committed as a link is not read through; and a forged
"proven" record with a recomputed digest passes ``check`` only with ``check`` saying what a
record can and cannot prove."""

import json
import os

import pytest

from tests.tools.hostile import committed_fork, pull_request, tool

BAD = {
    "nested": "[" * 100000 + "]" * 100000,
    "not utf-8": b"{\"stack_digest\": \"\xff\xfe\"}",
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_malformed_proof_record_is_an_error_naming_it(tmp_path, case):
    fork = committed_fork(tmp_path)
    data = BAD[case]

    def payload(pr):
        path = pr / "patches" / "proof.json"
        path.write_bytes(data if isinstance(data, bytes) else data.encode())

    ci = pull_request(fork, tmp_path, payload)
    proc = tool(ci, "check", cache=tmp_path / "cache")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out and "proof.json: not a proof record" in out, out[-2000:]
    proc = tool(ci, "list", cache=tmp_path / "cache")  # the table shows no verdict from it
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "not recorded" in proc.stdout


@pytest.mark.parametrize("name", ["proof.json", "mutants-equivalent.toml"])
def test_a_record_committed_as_a_link_is_not_read_through(tmp_path, name):
    fork = committed_fork(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text('{"stack_digest": "SECRET-CONTENT", "patches": []}\n')
    ci = pull_request(fork, tmp_path, lambda pr: os.symlink(secret, pr / "patches" / name))
    proc = tool(ci, "check", cache=tmp_path / "cache")
    out = proc.stdout + proc.stderr
    assert "SECRET-CONTENT" not in out and "Traceback" not in out
    if name == "proof.json":
        assert proc.returncode != 0 and "symlink" in out, out[-2000:]


def test_check_says_a_matching_record_proves_nothing_by_itself(tmp_path):
    """A pull request forges a 'proven' record for the stack it commits, digest recomputed."""
    from tools.rebase.git.paths import Layout
    from tools.rebase.stack.series import load_stack
    from tools.rebase.stack.state import current_digest

    fork = committed_fork(tmp_path)

    def payload(pr):
        layout = Layout(pr)
        _, patches = load_stack(layout)
        entries = [{"name": p.name, "verdict": "proven", "tests": 1, "failed": 1, "passed": 1} for p in patches]
        (pr / "patches" / "proof.json").write_text(json.dumps(
            {"stack_digest": current_digest(layout, patches), "patches": entries}))

    ci = pull_request(fork, tmp_path, payload)
    proc = tool(ci, "check", cache=tmp_path / "cache")
    assert "check: ok" in proc.stdout, proc.stderr
    assert "can forge" in proc.stdout and "re-proves" in proc.stdout
