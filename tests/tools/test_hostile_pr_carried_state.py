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
