"""Issue 46, item 5: a recorded edit of a merged blob (``resolutions/<Patch-Name>/<blob id>/``) is
data a pull request commits. It edits only a file its patch's replay changes at that stop (and the
one file it names), so a recording filed under keep-alpha cannot rewrite beta.py into keep-alpha's
patch; ``check`` refuses a recording that names a file its patch does not change."""

import subprocess

import pytest

from tests.tools.bumpkit import numbered, replace_line
from tests.tools.hostile import committed_fork, pull_request, tool

BETA = "megatron/core/beta.py"
EVIL = "EVIL = 'rewritten by a recorded resolution'\n"


def blob_of(text: str) -> str:
    return subprocess.run(["git", "hash-object", "--stdin"], input=text.encode(), capture_output=True,
                          check=True).stdout.decode().strip()


def forge_edit_of_beta(named: bool):
    """The payload: an edit of upstream's beta.py (the blob keep-alpha's replay meets in its tree)
    filed under keep-alpha, which changes alpha.py only; ``named``: it names beta.py too."""
    def payload(pr):
        before = numbered("beta")
        entry = pr / "patches" / "resolutions" / "keep-alpha" / blob_of(before)
        entry.mkdir(parents=True)
        (entry / "preimage").write_text(before)
        (entry / "postimage").write_text(before + EVIL)
        if named:
            (entry / "path").write_text(f"{BETA}\n")
    return payload


@pytest.mark.parametrize("named", [False, True], ids=["no-path", "names-beta"])
def test_a_recorded_edit_does_not_reach_a_file_its_patch_does_not_change(tmp_path, named):
    fork = committed_fork(tmp_path)
    fork.upstream_commit({"megatron/core/gamma.py": replace_line("gamma line 3\n", "gamma line 3 v2\n")},
                         "upstream: gamma", tag="v2")
    ci = pull_request(fork, tmp_path, forge_edit_of_beta(named))
    proc = tool(ci, "bump", "--onto", f"git:{fork.upstream}@v2", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exported = "".join(p.read_text() for p in sorted((ci / "patches").glob("*.patch")))
    assert "EVIL" not in exported
    assert BETA not in (ci / "patches" / "0001-keep-alpha.patch").read_text()
    assert "patches/resolutions/keep-alpha/" in proc.stdout and "not applied to megatron/core/beta.py" in proc.stdout


def test_check_refuses_a_recorded_edit_of_a_file_its_patch_does_not_change(tmp_path):
    fork = committed_fork(tmp_path)
    ci = pull_request(fork, tmp_path, forge_edit_of_beta(named=True))
    proc = tool(ci, "check", cache=tmp_path / "cache")
    assert proc.returncode != 0
    where = f"patches/resolutions/keep-alpha/{blob_of(numbered('beta'))}"
    assert f"{where}: edits {BETA}, a file keep-alpha does not change" in proc.stdout + proc.stderr
