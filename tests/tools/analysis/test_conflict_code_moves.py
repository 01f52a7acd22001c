"""A cause at every stop (issue 54, item 4): where blame of the conflict finds no upstream commit
(upstream renamed the file, deleted it, or moved the code to another file), the stop names the
commit that did it and says where the code went."""

import pytest

from tests.tools.bumpkit import make_fork, numbered, quiet, replace_line
from tools.rebase.bump import journal
from tools.rebase.bump.bump import Stopped, bump

B, G, D = "megatron/core/beta.py", "megatron/core/gamma.py", "megatron/core/delta.py"
A = "megatron/core/alpha.py"


def code(tag, n=40):
    """A file whose lines are long and distinct enough to be followed (``code_moves.distinctive``)."""
    return "".join(f"value_{tag}_{i} = compute_{tag}_thing({i}, scale=1.0)\n" for i in range(1, n + 1))


FILES = {
    "megatron/core/package_info.py": "MAJOR = 0\nMINOR = 42\nPATCH = 1\nPRE_RELEASE = ''\n__version__ = '0.42.1'\n",
    "megatron/core/__init__.py": "",
    A: code("alpha"), B: code("beta"), G: code("gamma"), D: code("delta"),
}


@pytest.fixture
def fork(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    return make_fork(tmp_path, files=FILES)


def _stop(fork):
    with pytest.raises(Stopped) as info:
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=lambda lay, n, ids: {})
    return str(info.value), journal.load(fork.layout).stopped.analysis


def _edit(tag, i):
    line = f"value_{tag}_{i} = compute_{tag}_thing({i}, scale=1.0)\n"
    return replace_line(line, line.replace("scale=1.0", "scale=2.0"))


def test_a_deleted_file_names_the_deleting_commit(fork):
    fork.stack([("edit-delta", {D: _edit("delta", 7)})])
    fork.upstream_commit({D: replace_line("value_delta_30 ", "value_delta_30b ")}, "upstream: touch delta")
    gone = fork.upstream_commit({D: None}, "upstream: delete delta", tag="v2")
    text, a = _stop(fork)
    assert a["types"] == {D: "modify/delete"}
    assert [c["commit"] for c in a["causes"]] == [gone]
    assert a["causes"][0]["how"] == f"{D}: file deleted"
    assert f"{gone[:12]} upstream: delete delta ({D}: file deleted)" in text


def test_a_renamed_file_names_the_rename_and_its_new_path(fork):
    fork.stack([("edit-gamma", {G: _edit("gamma", 20)})])
    new_path = "megatron/core/gamma_ops.py"
    renamer = fork.upstream_commit({G: None, new_path: code("gamma")}, "upstream: rename gamma")
    # rewritten afterwards past git's rename detection: the replay sees a deleted file
    fork.upstream_commit({new_path: code("ops", 60)}, "upstream: rewrite gamma_ops", tag="v2")
    text, a = _stop(fork)
    assert a["types"] == {G: "modify/delete"}
    assert [c["commit"] for c in a["causes"]] == [renamer]
    assert a["causes"][0]["how"] == f"{G}: renamed to {new_path}"
    assert f"renamed to {new_path}" in text


def test_code_moved_into_another_file_names_the_move_and_the_target(fork):
    fork.stack([("edit-beta", {B: _edit("beta", 12)})])
    mover = fork.upstream_commit({B: None, A: lambda text: text + code("beta")}, "upstream: fold beta into alpha",
                                 tag="v2")
    text, a = _stop(fork)
    assert [c["commit"] for c in a["causes"]] == [mover]
    assert a["causes"][0]["how"] == f"{B}: moved to {A}"


def test_lines_moved_out_of_a_file_that_stays_name_the_move(fork):
    helper = "megatron/core/gamma_helpers.py"
    fork.stack([("edit-gamma", {G: _edit("gamma", 20)})])

    def cut(text):
        lines = text.splitlines(keepends=True)
        return "".join(lines[:14] + lines[26:])

    moved = "".join(code("gamma").splitlines(keepends=True)[14:26])
    mover = fork.upstream_commit({G: cut, helper: moved}, "upstream: move gamma helpers", tag="v2")
    text, a = _stop(fork)
    assert a["types"] == {G: "content"}
    assert [c["commit"] for c in a["causes"]] == [mover]
    assert a["causes"][0]["how"] == f"{G}: moved to {helper}"
    assert f"moved to {helper}" in text


def test_the_search_follows_lines_a_merge_commit_took_out(fork, tmp_path):
    """A sync merge whose own resolution removed the code: no plain commit between the bases did."""
    from tests.tools.bumpkit import sh

    fork.stack([("edit-gamma", {G: _edit("gamma", 20)})])
    up = fork.upstream
    sh("git", "checkout", "-q", "-b", "side", cwd=up)
    fork.upstream_commit({B: replace_line("value_beta_3 ", "value_beta_3x ")}, "side: beta")
    sh("git", "checkout", "-q", "main", cwd=up)
    fork.upstream_commit({A: replace_line("value_alpha_3 ", "value_alpha_3x ")}, "main: alpha")
    sh("git", "merge", "-q", "--no-commit", "side", cwd=up, check=False)
    lines = code("gamma").splitlines(keepends=True)
    (up / G).write_text("".join(lines[:15] + lines[25:]))
    sh("git", "add", "-A", cwd=up)
    sh("git", "commit", "-q", "-m", "sync side into main", cwd=up)
    merge = sh("git", "rev-parse", "HEAD", cwd=up).strip()
    sh("git", "tag", "v2", cwd=up)
    text, a = _stop(fork)
    assert [c["commit"] for c in a["causes"]] == [merge]
    assert a["causes"][0]["how"] == f"{G}: deleted"


def test_a_merge_built_on_the_sync_is_not_named_with_it(fork):
    """The new base merges a branch that already carries the sync merge: the sync took the code
    out, the merge on top only repeats it against its own first parent."""
    from tests.tools.bumpkit import sh

    fork.stack([("edit-gamma", {G: _edit("gamma", 20)})])
    up = fork.upstream
    pin = sh("git", "rev-parse", "v1", cwd=up).strip()
    sh("git", "checkout", "-q", "-b", "side", cwd=up)
    fork.upstream_commit({B: replace_line("value_beta_3 ", "value_beta_3x ")}, "side: beta")
    sh("git", "checkout", "-q", "-b", "synced", pin, cwd=up)
    sh("git", "merge", "-q", "--no-commit", "side", cwd=up, check=False)
    lines = code("gamma").splitlines(keepends=True)
    (up / G).write_text("".join(lines[:15] + lines[25:]))
    sh("git", "add", "-A", cwd=up)
    sh("git", "commit", "-q", "-m", "merge side into synced", cwd=up)
    sync = sh("git", "rev-parse", "HEAD", cwd=up).strip()
    fork.upstream_commit({D: replace_line("value_delta_3 ", "value_delta_3x ")}, "pr: on top of the sync")
    sh("git", "checkout", "-q", "main", cwd=up)
    sh("git", "merge", "-q", "--no-ff", "-m", "merge the pr", "synced", cwd=up)
    sh("git", "tag", "v2", cwd=up)
    text, a = _stop(fork)
    assert [c["commit"] for c in a["causes"]] == [sync]


def test_a_file_only_a_dropped_patch_added_names_that_patch(fork):
    """modify/delete on a file the old stack added: upstream never had it; the patch that added it
    was dropped at an earlier stop of this bump, and the stop says so (the rehearsal onto PR 6756
    stopped twice on fork_compat.py with no cause)."""
    from tools.rebase.bump.bump import bump_continue

    helper = "megatron/core/helper_fork.py"
    fork.stack([("add-helper", {helper: code("helper", 10), G: _edit("gamma", 20)}),
                ("use-helper", {helper: _edit("helper", 4)})])
    fork.upstream_commit({G: replace_line("value_gamma_20 ", "value_gamma_20_up ")}, "upstream: gamma 20", tag="v2")
    _stop(fork)
    with pytest.raises(Stopped) as info:
        bump_continue(fork.layout, drop=True, log=quiet, test_runner=lambda lay, n, ids: {})
    a = journal.load(fork.layout).stopped.analysis
    assert a["types"] == {helper: "modify/delete"}
    assert a["causes"] == []
    assert "introduced by a patch dropped in this bump: add-helper" in str(info.value)
