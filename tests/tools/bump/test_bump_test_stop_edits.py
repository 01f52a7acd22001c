"""A patch that merged cleanly but had to be amended at a test stop: the amendment is recorded in
resolutions/ and replayed by the next bump (and forecast by ``--dry-run``), so a refresh of a
line does not stop on the same tests again."""


import pytest

from tests.tools.bumpkit import ENV, make_fork, quiet, replace_line, resolve_conflict, seeded_line_with_resolutions, sh
from tools.rebase.bump.bump import Stopped, bump, bump_continue
from tools.rebase.bump.forecast import forecast
from tools.rebase.bump.journal import load
from tools.rebase.proof.check import check

A, B, D = "megatron/core/alpha.py", "megatron/core/beta.py", "megatron/core/delta.py"

STACK = [
    ("keep-alpha", {A: replace_line("alpha line 10\n", "alpha line 10 fork\n")}),
    ("tweak-beta", {B: replace_line("beta line 5\n", "beta line 5 fork\n")}),
    ("new-module", {"megatron/core/fork_extra.py": "EXTRA = 1\n"}),
]


def fitted_runner(fork, ran=None):
    """Tests that pass only on a tree carrying the test-stop amendment of keep-alpha (both files:
    the one the patch changes and the one it did not touch before, an upstream refusal removed)."""
    def runner(layout, name, ids):
        if ran is not None:
            ran.append(name)
        ok = "fitted" in (fork.work / A).read_text() and "refusal removed" in (fork.work / D).read_text()
        return {i: "passed" if ok else "failed" for i in ids}
    return runner


def amend_first_patch(fork):
    """What a maintainer does at a test stop: amend keep-alpha's commit, rebase the rest onto it
    (committer date = author date, as the tool commits)."""
    j = load(fork.layout)
    work = fork.work
    first, tip = sh("git", "rev-list", "--reverse", f"{j.new_base}..{j.tip}", cwd=work).split()[0], j.tip
    sh("git", "checkout", "-q", "--detach", first, cwd=work)
    (work / A).write_text((work / A).read_text().replace("alpha line 10 fork\n", "alpha line 10 fork, fitted\n"))
    (work / D).write_text((work / D).read_text().replace("delta line 3 upstream\n", "delta line 3, refusal removed\n"))
    date = sh("git", "show", "-s", "--format=%ad", "--date=raw", first, cwd=work).strip()
    sh("git", "commit", "-q", "-a", "--amend", "--no-edit", cwd=work, env={**ENV, "GIT_COMMITTER_DATE": date})
    sh("git", "rebase", "-q", "--committer-date-is-author-date", "--onto", "HEAD", first, tip, cwd=work)


@pytest.mark.slow
def test_amendment_at_a_test_stop_replays_on_the_next_bump(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    fork.upstream_commit({D: replace_line("delta line 3\n", "delta line 3 upstream\n")}, "upstream: delta 3")
    fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 upstream\n")}, "upstream: beta 5")
    sh("git", "tag", "v2", cwd=fork.upstream)
    before_pin, before_patches = fork.layout.pin.read_bytes(), fork.patch_files()
    with pytest.raises(Stopped):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=fitted_runner(fork))
    resolve_conflict(fork.work, B, "beta line 5 upstream and fork")
    with pytest.raises(Stopped, match="tests fail on the bumped stack"):
        bump_continue(fork.layout, log=quiet, test_runner=fitted_runner(fork))
    amend_first_patch(fork)
    bump_continue(fork.layout, log=quiet, test_runner=fitted_runner(fork))
    after = fork.patch_files()
    assert any(b"refusal removed" in data for name, data in after.items() if "keep-alpha" in name)

    # Another machine refreshes a line seeded with the old patches (keep-alpha's release version
    # does not change delta.py; the line's own, in the seed's backup, does).
    clone = seeded_line_with_resolutions(tmp_path, fork, before_pin, before_patches, monkeypatch)
    dry = forecast(clone.layout, f"git:{fork.upstream}@v2")
    assert [r["status"] for r in dry["patches"]] == ["resolved (recorded resolution)"] * 2 + ["clean"]
    assert not dry["would_stop"]
    ran = []
    data = bump(clone.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=fitted_runner(clone, ran))
    assert ran == ["keep-alpha", "tweak-beta", "new-module"]  # every patch's, on the stack with the edit
    assert clone.patch_files() == after
    row = next(r for r in data["mapping"] if r["new"] and r["new"][0]["subject"] == "keep-alpha")
    assert "resolved by a recorded resolution (edits of a clean merge)" in row["note"]
    assert check(clone.layout, log=quiet) == []


def test_edit_at_a_conflict_stop_of_a_file_the_merge_left_alone_replays(tmp_path, monkeypatch):
    # rerere and the merged blobs both miss a file the patch does not touch: the stop's edit of it
    # (an upstream refusal removed next to the conflict) is keyed by the blob it had before.
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    fork.upstream_commit({D: replace_line("delta line 3\n", "delta line 3 upstream\n")}, "upstream: delta 3")
    fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 upstream\n")}, "upstream: beta 5")
    sh("git", "tag", "v2", cwd=fork.upstream)
    before_pin, before_patches = fork.layout.pin.read_bytes(), fork.patch_files()
    with pytest.raises(Stopped):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet)
    resolve_conflict(fork.work, B, "beta line 5 upstream and fork")
    (fork.work / D).write_text((fork.work / D).read_text().replace("delta line 3 upstream\n", "delta line 3 gone\n"))
    sh("git", "add", D, cwd=fork.work)
    bump_continue(fork.layout, log=quiet, test_runner=lambda l, n, ids: {i: "passed" for i in ids})
    after = fork.patch_files()
    assert any(b"delta line 3 gone" in data for name, data in after.items() if "tweak-beta" in name)
    # the recorded edit of delta.py reaches it on a line whose own tweak-beta changes delta.py
    clone = seeded_line_with_resolutions(tmp_path, fork, before_pin, before_patches, monkeypatch)
    bump(clone.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=lambda l, n, ids: {i: "passed" for i in ids})
    assert clone.patch_files() == after
