"""Issue 56, item 5: ``check --strict-records`` reads ``REBASE_REPORT.json`` and ``.md``: a file
that is not a report (its schema), a JSON not written as the tool writes one, or a Markdown page
that is not what its JSON renders to is a problem naming the file."""

import json

import pytest

from tests.tools.bumpkit import all_pass, commit_checkout, ignore_generated, quiet, replace_line
from tests.tools.hostile import STACK, committed_fork, pull_request, tool


@pytest.fixture
def bumped(tmp_path, monkeypatch):
    """A committed fork after a bump onto v2: its REBASE_REPORT.md/.json are the bump's."""
    from tools.rebase.bump.bump import bump

    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork = committed_fork(tmp_path, stack=STACK)
    fork.upstream_commit({"megatron/core/gamma.py": replace_line("gamma line 3\n", "gamma line 3 v2\n")},
                         "upstream v2", tag="v2")
    bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=all_pass)
    ignore_generated(fork)
    commit_checkout(fork, "bump onto v2")
    assert fork.layout.report_json.is_file() and fork.layout.report_md.is_file()
    return fork


def _strict_check(ci, tmp_path):
    return tool(ci, "check", "--no-base", "--strict-records", cache=tmp_path / "cache")


def test_the_reports_a_bump_wrote_pass(bumped, tmp_path):
    proc = _strict_check(bumped.root, tmp_path)
    assert "REBASE_REPORT" not in proc.stderr, proc.stderr


def _rewrite(name, change):
    def payload(pr):
        path = pr / name
        path.write_text(change(path.read_text()))
    return payload


CASES = {
    "not-a-report": ("REBASE_REPORT.json", lambda text: '{"hello": "world"}\n',
                     "REBASE_REPORT.json: not a report: the report lacks 'schema'"),
    "other-schema": ("REBASE_REPORT.json", lambda text: text.replace('"fork-rebase-report/1"', '"forged/9"'),
                     "REBASE_REPORT.json: not a report: its schema is 'forged/9'"),
    "entry-without-status": ("REBASE_REPORT.json",
                             lambda text: text.replace('"status": ', '"statut": ', 1),
                             "REBASE_REPORT.json: not a report: mapping[0] lacks 'status'"),
    "not-json": ("REBASE_REPORT.json", lambda text: text[:-20], "REBASE_REPORT.json: not a report: not JSON"),
    "unsorted-json": ("REBASE_REPORT.json", lambda text: json.dumps(json.loads(text)) + "\n",
                      "REBASE_REPORT.json: not written as the tool writes a report"),
    "md-edited": ("REBASE_REPORT.md", lambda text: text.replace("# Rebase report", "# Rebase report\n\nAll proven.", 1),
                  "REBASE_REPORT.md: does not match what REBASE_REPORT.json renders to"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_forged_report_fails_the_release_check(bumped, tmp_path, case):
    name, change, message = CASES[case]
    ci = pull_request(bumped, tmp_path, _rewrite(name, change))
    proc = _strict_check(ci, tmp_path)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert message in proc.stderr, proc.stderr


def test_a_report_without_its_pair_fails_the_release_check(bumped, tmp_path):
    ci = pull_request(bumped, tmp_path, lambda pr: (pr / "REBASE_REPORT.md").unlink())
    proc = _strict_check(ci, tmp_path)
    assert proc.returncode != 0 and "REBASE_REPORT.json: there is no REBASE_REPORT.md beside it" in proc.stderr, \
        proc.stderr
