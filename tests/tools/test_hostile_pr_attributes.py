"""Issue 22, items 4, 5, 7 and the validator's Low items: in-tree .gitattributes reach no
format-patch, am or merge of the tool's repositories, and a patch is refused for anything git am
would apply that is not a plain text change under megatron/."""

import pytest

from tests.tools.bumpkit import ENV, UPSTREAM_FILES, all_pass, patch_msg, quiet, replace_line, sh
from tests.tools.hostile import committed_fork, pull_request, tool


def _format_patch(tmp_path, edits: dict, name: str) -> str:
    """``edits`` on the synthetic upstream as one format-patch file (plain git, not the tool)."""
    repo = tmp_path / f"scratch-{name}"
    repo.mkdir()
    sh("git", "init", "-q", "-b", "main", cwd=repo)
    for rel, text in UPSTREAM_FILES.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    sh("git", "add", "-A", cwd=repo)
    sh("git", "commit", "-q", "-m", "base", cwd=repo)
    for rel, text in edits.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    sh("git", "add", "-A", cwd=repo)
    sh("git", "commit", "-q", "-m", patch_msg(name), cwd=repo, env=ENV)
    return sh("git", "format-patch", "--stdout", "-1", "--zero-commit", "--full-index", "--no-signature",
              "--no-stat", cwd=repo)


def _add_patch(text: str, file_name="0003-evil.patch"):
    def payload(pr):
        (pr / "patches" / file_name).write_text(text)
        with open(pr / "patches" / "series", "a") as fh:
            fh.write(file_name + "\n")
    return payload


EVIL = {
    "attributes": ({"megatron/.gitattributes": "*.py -diff\n"}, "must not add or change .gitattributes"),
    "gitmodules": ({".gitmodules": '[submodule "x"]\n\tpath = megatron/x\n\turl = /tmp/x\n'},
                   "must not add or change .gitmodules"),
    "tool-code": ({"tools/rebase/cli.py": "print('the patch runs')\n"}, "patches change files under megatron/ only"),
    "pin": ({"upstream.toml": "[upstream]\n"}, "patches change files under megatron/ only"),
}


@pytest.mark.parametrize("case", sorted(EVIL))
def test_a_patch_touching_git_control_files_or_anything_outside_megatron_is_refused(tmp_path, case):
    edits, message = EVIL[case]
    fork = committed_fork(tmp_path)
    ci = pull_request(fork, tmp_path, _add_patch(_format_patch(tmp_path, edits, "evil")))
    for command in ("apply", "check"):
        proc = tool(ci, command, cache=tmp_path / "cache")
        assert proc.returncode != 0
        assert "0003-evil.patch:" in proc.stderr and message in proc.stderr, proc.stderr
    assert not (ci / ".rebase" / "work" / next(iter(edits))).exists()


def _rewrite(case: str, text: str) -> str:
    """Hand-made payloads format-patch never writes."""
    head, sep, diff = text.partition("\ndiff --git ")
    if case == "symlink-0120000":
        return text.replace("new file mode 100644", "new file mode 0120000")
    if case == "gitlink":
        return text.replace("new file mode 100644", "new file mode 160000")
    if case == "diff-before-diff-git":  # a traditional diff git am applies; the old parser skipped it
        return head + "\n--- a/evil.py\n+++ b/evil.py\n@@ -0,0 +1 @@\n+pwned\n" + sep + diff
    if case == "diff-between-files":
        return text + "--- a/tools/evil.py\n+++ b/tools/evil.py\n@@ -0,0 +1 @@\n+pwned\n"
    raise AssertionError(case)


@pytest.mark.parametrize("case, message", [
    ("symlink-0120000", "refusing a symlink"),
    ("gitlink", "refusing a gitlink"),
    ("diff-before-diff-git", "unexpected line before the first 'diff --git'"),
    ("diff-between-files", "unexpected line between two files"),
])
def test_what_git_am_would_apply_is_what_the_validator_checks(tmp_path, case, message):
    text = _format_patch(tmp_path, {"megatron/core/new.py": "x = 1\n"}, "evil")
    fork = committed_fork(tmp_path)
    ci = pull_request(fork, tmp_path, _add_patch(_rewrite(case, text)))
    proc = tool(ci, "apply", cache=tmp_path / "cache")
    assert proc.returncode != 0
    assert "0003-evil.patch:" in proc.stderr and message in proc.stderr, proc.stderr
    work = ci / ".rebase" / "work"
    assert not (work / "evil.py").exists() and not (work / "tools" / "evil.py").exists()


def test_an_upstream_gitattributes_cannot_make_the_export_binary_or_change_hunk_headers(tmp_path):
    files = dict(UPSTREAM_FILES, **{"megatron/.gitattributes": "*.py -diff\n",
                                    "megatron/core/.gitattributes": "beta.py diff=cpp\n"})
    fork = committed_fork(tmp_path, files=files)
    plain = committed_fork(tmp_path / "plain")  # the same upstream files without the attributes
    assert fork.patch_files() == plain.patch_files()
    for text in [v for k, v in fork.patch_files().items() if k.endswith(".patch")]:
        assert b"Binary files" not in text and b"\n@@ -" in text, text
    ci = pull_request(fork, tmp_path, lambda pr: None)
    proc = tool(ci, "check", cache=tmp_path / "cache")
    assert proc.returncode == 0 and "fresh export is byte-identical" in proc.stdout, proc.stdout + proc.stderr


def test_a_merge_driver_in_a_new_upstream_cannot_hide_a_bump_conflict(tmp_path, monkeypatch):
    from tools.rebase.bump.bump import Stopped, bump

    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork = committed_fork(tmp_path)
    fork.upstream_commit({"megatron/.gitattributes": "* merge=union\n",
                          "megatron/core/beta.py": replace_line("beta line 5\n", "beta line 5 upstream\n")},
                         "upstream v2", tag="v2")
    with pytest.raises(Stopped):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=all_pass)
    assert "<<<<<<<" in (fork.work / "megatron" / "core" / "beta.py").read_text()
