"""Report refinements of issue 15: a patch folded into another new patch is merged (item 1), a
subject that changes only its series counter is not message-only (item 3), and the review focus
credits each patch with its own files and the upstream commits that touched them (item 7)."""

from tests.tools.bumpkit import branch_of_patches, commit, init, numbered, patch_msg, replace_line, sh
from tools.rebase.report.report import build_report

FIVE = "".join(f"f line {i}\n" for i in range(3, 8))


def test_folded_patch_counter_only_subject_and_own_file_review(tmp_path):
    repo = tmp_path / "repo"
    b0 = init(repo, {f"{t}.py": numbered(t) for t in "fghk"}, "upstream 1.0")
    block = "".join(f"fork_value_{i} = {i}\n" for i in range(4))
    old_tip = branch_of_patches(repo, b0, [
        ({"f.py": replace_line(FIVE, block)}, patch_msg("fold-me", subject="[1/3] fold me")),
        ({"g.py": replace_line("g line 5\n", "g line 5 fork\n")}, patch_msg("keeper", subject="[2/3] keeper")),
        ({"h.py": replace_line("h line 9\n", "h line 9 fork\n")}, patch_msg("counted", subject="[3/3] counted")),
    ], "old")
    sh("git", "checkout", "-q", "main", cwd=repo)
    # Upstream rewrites the five lines fold-me replaced, and touches h.py and k.py in one commit.
    up1 = commit(repo, {"f.py": replace_line(FIVE, FIVE.replace("\n", " up\n"))}, "upstream: reword f")
    up2 = commit(repo, {"h.py": replace_line("h line 30\n", "h line 30 up\n"),
                        "k.py": replace_line("k line 2\n", "k line 2 up\n")}, "upstream: h and k")
    b1 = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    new_tip = branch_of_patches(repo, b1, [
        ({"f.py": replace_line(FIVE.replace("\n", " up\n"), block),
          "g.py": replace_line("g line 5\n", "g line 5 fork\n")}, patch_msg("keeper", subject="[1/2] keeper")),
        ({"h.py": replace_line("h line 9\n", "h line 9 fork\n")}, patch_msg("counted", subject="[2/2] counted")),
    ], "new")

    data = build_report(repo, b0, old_tip, b1, new_tip)
    rows = {e["patch_name"]: e for e in data["mapping"]}
    merged = rows["keeper"]
    assert merged["status"] == "merged"
    assert [r["subject"] for r in merged["old"]] == ["[1/3] fold me", "[2/3] keeper"]
    assert not [e for e in data["mapping"] if e["status"] == "dropped"]
    counted = rows["counted"]
    assert counted["status"] in ("identical", "renumbered", "refreshed"), counted
    assert "series counter [3/3] -> [2/2]" in counted["note"]
    review = {item["patch"]: item for item in data["review"]}
    # counted touches h.py only: credited with up2 for h.py, not with k.py or f.py.
    item = review["#2 counted"]
    assert item["files"] == ["h.py"] and item["commits"] == [up2]
    assert "`k.py`" not in item["why"] and "`f.py`" not in item["why"]
    assert review["#1 keeper"]["commits"] == [up1]


def test_real_wording_change_stays_message_only(tmp_path):
    repo = tmp_path / "repo"
    b0 = init(repo, {"a.py": numbered("a")}, "upstream 1.0")
    edit = {"a.py": replace_line("a line 3\n", "a line 3 fork\n")}
    old_tip = branch_of_patches(repo, b0, [(edit, patch_msg("p", subject="[1/1] fix the thing"))], "old")
    new_tip = branch_of_patches(repo, b0, [(edit, patch_msg("p", subject="[1/1] fix the other thing"))], "new")
    (row,) = build_report(repo, b0, old_tip, b0, new_tip)["mapping"]
    assert row["status"] == "message-only"
