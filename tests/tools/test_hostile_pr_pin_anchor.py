"""Issue 56, item 2: a git pin's commit must be on a branch or tag of the upstream repository.
GitHub serves every pull request's head (``refs/pull/N/head``) through the upstream URL, and the
upstream mirror carries ``pull-request/*`` branches; a pull request that points the pin at such a
commit (with no ``ref``, or a lying one) must not make ``check``, ``apply`` or ``bump`` build on it.
``FORK_REBASE_ALLOW_UNANCHORED_PIN=1`` lets a maintainer rehearse on such a commit."""

import pytest

from tests.tools.bumpkit import commit, replace_line, sh
from tests.tools.hostile import committed_fork, pull_request, tool

A = "megatron/core/alpha.py"
REFUSED = "is on no branch or tag of"


def _side_commit(upstream, ref: str) -> str:
    """A commit on top of v1 that only ``ref`` names (a pull request's head in the upstream repo)."""
    sh("git", "checkout", "-q", "--detach", "v1", cwd=upstream)
    sha = commit(upstream, {A: replace_line("alpha line 30\n", "alpha line 30 from a pull request\n")},
                 "a contributor's change")
    sh("git", "update-ref", ref, sha, cwd=upstream)
    sh("git", "checkout", "-q", "main", cwd=upstream)
    return sha


def _pin_to(sha: str, ref_line: str = ""):
    def payload(pr):
        pin = pr / "upstream.toml"
        text = pin.read_text()
        old = text.split('commit = "', 1)[1].split('"', 1)[0]
        text = text.replace(old, sha)
        text = "".join(line + "\n" for line in text.splitlines() if not line.startswith("ref ="))
        pin.write_text(text + ref_line)
    return payload


@pytest.mark.parametrize("ref", ["refs/pull/7/head", "refs/heads/pull-request/7"])
def test_a_pin_on_a_pull_requests_commit_is_refused_by_check_and_apply(tmp_path, ref):
    fork = committed_fork(tmp_path)
    sha = _side_commit(fork.upstream, ref)
    ci = pull_request(fork, tmp_path, _pin_to(sha, 'ref = "v1"\n'))  # a lying ref does not help
    for command in ("check", "apply"):
        proc = tool(ci, command, cache=tmp_path / "cache")
        assert proc.returncode != 0, proc.stdout + proc.stderr
        assert f"commit {sha} {REFUSED} {fork.upstream}" in proc.stderr, proc.stderr
        assert "pull-request/* and gh-readonly-queue/* branches and refs/pull/* do not count" in proc.stderr
    assert not (ci / "megatron").exists()
    assert not (ci / ".rebase" / "work" / A).exists()


def test_the_rehearsal_setting_lets_a_maintainer_build_on_it_with_a_warning(tmp_path):
    fork = committed_fork(tmp_path)
    sha = _side_commit(fork.upstream, "refs/pull/7/head")
    ci = pull_request(fork, tmp_path, _pin_to(sha))
    proc = tool(ci, "apply", cache=tmp_path / "cache", env={"FORK_REBASE_ALLOW_UNANCHORED_PIN": "1"})
    assert proc.returncode == 0, proc.stderr
    assert f"commit {sha} {REFUSED}" in proc.stderr and "FORK_REBASE_ALLOW_UNANCHORED_PIN=1" in proc.stderr
    assert "from a pull request" in (ci / A).read_text()


def test_a_commit_on_a_branch_or_a_tag_is_anchored(tmp_path):
    fork = committed_fork(tmp_path)
    sh("git", "checkout", "-q", "-b", "core_r0.99", "v1", cwd=fork.upstream)
    on_branch = commit(fork.upstream, {A: replace_line("alpha line 30\n", "alpha line 30 release\n")}, "release")
    sh("git", "checkout", "-q", "main", cwd=fork.upstream)
    ci = pull_request(fork, tmp_path, _pin_to(on_branch))
    proc = tool(ci, "apply", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert "release" in (ci / A).read_text()


def test_a_mirrors_pull_request_branch_does_not_anchor(tmp_path):
    """``--mirror`` reads a local copy of upstream, with its refs/heads/pull-request/* branches:
    only its other branches and its tags count."""
    fork = committed_fork(tmp_path)
    mirror = tmp_path / "mirror.git"
    sh("git", "clone", "-q", "--mirror", str(fork.upstream), str(mirror), cwd=tmp_path)
    sha = _side_commit(fork.upstream, "refs/heads/pull-request/9")
    sh("git", "fetch", "-q", str(fork.upstream), "+refs/heads/*:refs/heads/*", cwd=mirror)
    assert sh("git", "rev-parse", "refs/heads/pull-request/9", cwd=mirror).strip() == sha
    ci = pull_request(fork, tmp_path, _pin_to(sha))
    proc = tool(ci, "check", "--mirror", str(mirror), cache=tmp_path / "cache")
    assert proc.returncode != 0 and f"commit {sha} {REFUSED}" in proc.stderr, proc.stdout + proc.stderr
    sh("git", "branch", "-q", "hotfix", sha, cwd=mirror)  # the same commit on a real branch: anchored
    proc = tool(ci, "check", "--mirror", str(mirror), cache=tmp_path / "cache")
    assert REFUSED not in proc.stderr, proc.stderr


def test_bump_onto_a_pull_requests_commit_is_refused(tmp_path):
    fork = committed_fork(tmp_path)
    _side_commit(fork.upstream, "refs/heads/pull-request/7")
    before = fork.layout.pin.read_bytes()
    proc = tool(fork.root, "bump", "--onto", f"git:{fork.upstream}@pull-request/7", cache=tmp_path / "cache")
    assert proc.returncode != 0 and REFUSED in proc.stderr, proc.stdout + proc.stderr
    assert fork.layout.pin.read_bytes() == before


def test_check_without_the_base_says_the_anchoring_is_not_verified(tmp_path):
    fork = committed_fork(tmp_path)
    proc = tool(fork.root, "check", "--no-base", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert "pin anchoring NOT verified" in proc.stdout + proc.stderr


def test_a_base_that_holds_a_tools_rebase_folder_is_refused(tmp_path):
    """Checked out in ``.rebase/work``, a base's ``tools/rebase/`` would stand in for the tool when
    ``python -m tools.rebase`` runs there; an upstream branch that carried one is refused too."""
    fork = committed_fork(tmp_path)
    sha = fork.upstream_commit({"tools/__init__.py": "", "tools/rebase/__init__.py": "",
                                "tools/rebase/__main__.py": "print('not the tool')\n"}, "a tool of its own")
    ci = pull_request(fork, tmp_path, _pin_to(sha))
    proc = tool(ci, "apply", cache=tmp_path / "cache")
    assert proc.returncode != 0 and "holds tools/rebase/" in proc.stderr, proc.stdout + proc.stderr
    assert not (ci / ".rebase" / "work" / "tools" / "rebase").exists()
