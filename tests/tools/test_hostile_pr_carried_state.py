"""Issue 46, Low items: state the tool keeps under ``.rebase/`` that a checkout or an unpacked
archive carries is not taken as the tool's own. A bump journal with no backup the tool made (a
version-1 journal kept its backup's manifest in itself) is refused by ``bump --abort``, which
restores nothing; before, it deleted the pin, patches/, README.md and the work repo's refs."""

import json

from tests.tools.bumpkit import sh
from tests.tools.hostile import committed_fork, pull_request, tool

CARRIED_V1_JOURNAL = {
    "version": 1, "onto": "git:x@v2", "phase": "stopped",
    "backup_present": [], "work_refs": {}, "work_head_ref": "", "work_head": "0" * 40,
}


def test_bump_abort_refuses_a_carried_journal_and_restores_nothing(tmp_path):
    fork = committed_fork(tmp_path)
    (fork.root / "README.md").write_text("# fork\n")
    sh("git", "add", "README.md", cwd=fork.root)
    sh("git", "commit", "-q", "-m", "readme", cwd=fork.root)
    ci = pull_request(fork, tmp_path, lambda pr: None)
    cache = tmp_path / "cache"
    assert tool(ci, "apply", cache=cache).returncode == 0
    refs = sh("git", "for-each-ref", cwd=ci / ".rebase" / "work")
    # a journal an archive unpacked over the checkout carries (naming this work repo's commit)
    journal = ci / ".rebase" / "bump" / "journal.json"
    journal.parent.mkdir(parents=True)
    head = sh("git", "rev-parse", "HEAD", cwd=ci / ".rebase" / "work").strip()
    journal.write_text(json.dumps({**CARRIED_V1_JOURNAL, "work_head": head}))
    before = {p: (ci / p).read_bytes() for p in ("upstream.toml", "README.md", "patches/series",
                                                   "patches/0001-keep-alpha.patch")}
    proc = tool(ci, "bump", "--abort", cache=cache)
    assert proc.returncode != 0
    assert ".rebase/bump/journal.json" in proc.stderr and "nothing was restored" in proc.stderr, proc.stderr
    assert {p: (ci / p).read_bytes() for p in before} == before
    assert sh("git", "for-each-ref", cwd=ci / ".rebase" / "work") == refs


def test_a_fresh_clone_report_says_its_test_results_are_the_committed_ones(tmp_path, monkeypatch):
    """A forged ``REBASE_REPORT.json`` (test results a pull request wrote) regenerates as it is in
    a fresh clone; ``report`` says the results were read back from it, not run."""
    from tests.tools.bump.test_bump import bump_stops, resolve_beta, upstream_v2
    from tests.tools.bumpkit import all_pass, commit_checkout, quiet
    from tools.rebase.bump.bump import bump_continue

    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache0"))
    fork = committed_fork(tmp_path)
    upstream_v2(fork, conflict=True)
    bump_stops(fork)
    resolve_beta(fork, "beta line 5 both")
    bump_continue(fork.layout, log=quiet, test_runner=all_pass)
    commit_checkout(fork, "bump to v2")

    def forge(pr):
        report = json.loads((pr / "REBASE_REPORT.json").read_text())
        rows = [row for row in report["mapping"] if row.get("tests")]
        assert rows  # the resolved patch's tests ran in the bump
        for row in rows:
            row["tests"] = {node: "passed (forged)" for node in row["tests"]}
        (pr / "REBASE_REPORT.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")

    ci = pull_request(fork, tmp_path, forge)
    proc = tool(ci, "report", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert "passed (forged)" in (ci / "REBASE_REPORT.md").read_text()  # regenerated as committed
    assert ("test result(s) of 1 patch(es) are read back from the committed REBASE_REPORT.json, not run "
            "here") in proc.stdout, proc.stdout
