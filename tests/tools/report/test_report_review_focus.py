"""The report's "Review focus": changed patches, and unchanged ones next to upstream churn."""

from tests.tools.bumpkit import commit, init, numbered, patch_msg, replace_line, sh
from tools.rebase.report.render import render_markdown
from tools.rebase.report.report import build_report


def test_review_focus_names_unchanged_patches_beside_upstream_changes(tmp_path):
    repo = tmp_path / "repo"
    b0 = init(repo, {"a.py": numbered("a"), "b.py": numbered("b"), "c.py": numbered("c")}, "upstream 1.0")
    stack = [
        ({"a.py": replace_line("a line 5\n", "a line 5 fork\n")}, patch_msg("near-churn")),
        ({"b.py": replace_line("b line 5\n", "b line 5 fork\n")}, patch_msg("quiet")),
        ({"c.py": replace_line("c line 5\n", "c line 5 fork v1\n")}, patch_msg("changed")),
    ]
    sh("git", "checkout", "-q", "-b", "old", b0, cwd=repo)
    for edits, msg in stack:
        commit(repo, edits, msg)
    old_tip = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    sh("git", "checkout", "-q", "main", cwd=repo)
    commit(repo, {"a.py": replace_line("a line 30\n", "a line 30 upstream\n")}, "upstream: edit a.py far away")
    b1 = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    stack[2] = ({"c.py": replace_line("c line 5\n", "c line 5 fork v2\n")}, patch_msg("changed"))
    for edits, msg in stack:
        commit(repo, edits, msg)
    new_tip = sh("git", "rev-parse", "HEAD", cwd=repo).strip()

    data = build_report(repo, b0, old_tip, b1, new_tip)
    assert [e["status"] for e in data["mapping"]] == ["identical", "identical", "modified"]
    assert [e["patch_name"] for e in data["mapping"]] == ["near-churn", "quiet", "changed"]
    review = {item["patch"]: item["why"] for item in data["review"]}
    assert set(review) == {"#1 near-churn", "#3 changed"}, "the quiet patch needs no review"
    far = sh("git", "rev-parse", "HEAD~3", cwd=repo).strip()
    assert review["#1 near-churn"] == (
        f"identical, but upstream changed `a.py`, which it also touches: check the interaction "
        f"(upstream commit {far[:12]})")
    assert review["#3 changed"].startswith("modified")
    (entry,) = data["upstream_churn"]["entries"]
    assert entry["files"] == ["a.py"] and entry["patches"] == [1]
    md = render_markdown(data)
    assert "## Review focus\n\n- #1 near-churn: identical, but upstream changed `a.py`" in md
    assert "(`a.py`); touched by patches 1" in md
