"""Issue 46, Low items: state the tool keeps under ``.rebase/`` that a checkout or an unpacked
archive carries is not taken as the tool's own. A bump journal with no backup the tool made (a
version-1 journal kept its backup's manifest in itself) is refused by ``bump --abort``, which
restores nothing; before, it deleted the pin, patches/, README.md and the work repo's refs."""

import json

from tests.tools.bumpkit import sh
from tests.tools.hostile import committed_fork, pull_request, tool, unpacked_archive

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
        assert len(rows) == 2  # the finishing gate ran every patch's tests on the bumped stack
        for row in rows:
            row["tests"] = {node: "passed (forged)" for node in row["tests"]}
        (pr / "REBASE_REPORT.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")

    ci = pull_request(fork, tmp_path, forge)
    proc = tool(ci, "report", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert "passed (forged)" in (ci / "REBASE_REPORT.md").read_text()  # regenerated as committed
    assert ("2 test result(s) of 2 patch(es) are read back from the committed REBASE_REPORT.json, not run "
            "here") in proc.stdout, proc.stdout


def test_a_carried_sdist_in_the_checkouts_cache_is_not_taken_as_the_tools(tmp_path, find_links):
    """An unpacked archive carries ``.rebase/cache/sdist/`` with the sdist its forged pin names,
    one the index never served: ``apply`` (the default cache, inside the checkout) refuses it,
    naming it, instead of building on it."""
    from tests.tools.sdists import pinned_to_sdist, write_sdist

    files = {"PKG-INFO": "Name: megatron-core\n", "megatron/core/__init__.py": "",
             "megatron/core/package_info.py": "MAJOR = 9\nMINOR = 9\nPATCH = 9\n"}
    name = "megatron_core-9.9.9.tar.gz"
    forged = tmp_path / "forged" / name
    sha = write_sdist(forged, "megatron_core-9.9.9", files)
    ci = pull_request(committed_fork(tmp_path), tmp_path, pinned_to_sdist("megatron-core", "9.9.9", sha))
    (ci / ".rebase" / "cache" / "sdist").mkdir(parents=True)
    (ci / ".rebase" / "cache" / "sdist" / name).write_bytes(forged.read_bytes())
    checkout = unpacked_archive(tmp_path, ci, keep=lambda rel: rel.parts[1:2] == ("cache",))
    assert (checkout / ".rebase" / "cache" / "sdist" / name).is_file()
    proc = tool(checkout, "apply")  # no FORK_REBASE_CACHE: the checkout's own cache
    assert proc.returncode != 0
    assert f".rebase/cache/sdist/{name}: a cached sdist the tool did not download here" in proc.stderr, proc.stderr
    assert not (checkout / "megatron").exists()


def test_the_tools_own_download_into_the_checkouts_cache_is_reused(tmp_path, find_links):
    from tests.tools.sdists import pinned_to_sdist, write_sdist

    files = {"PKG-INFO": "Name: megatron-core\n", "megatron/core/__init__.py": "",
             "megatron/core/package_info.py": "MAJOR = 9\nMINOR = 9\nPATCH = 8\n"}
    sha = write_sdist(find_links / "megatron_core-9.9.8.tar.gz", "megatron_core-9.9.8", files)
    ci = pull_request(committed_fork(tmp_path), tmp_path, pinned_to_sdist("megatron-core", "9.9.8", sha))
    first = tool(ci, "apply")
    assert first.returncode == 0 and "downloading the sdist" in first.stderr, first.stderr
    (find_links / "megatron_core-9.9.8.tar.gz").unlink()  # offline from now on
    again = tool(ci, "apply", "--force")
    assert again.returncode == 0 and "downloading" not in again.stderr, again.stderr
