"""Reason lines (issue 26, item 8): every modified or refreshed row names the upstream change that
touched or shifted its hunks, with what it did (removed a helper, renamed a field, added lines above)."""

from tests.tools.bumpkit import branch_of_patches, commit, init, numbered, replace_line, sh
from tools.rebase.report.render import render_markdown
from tools.rebase.report.report import build_report

HELPER = "def old_helper(x):\n    return x + 1\n"
FIELD = "    cache_size: int = 0\n"
# An earlier patch of the stack grows f.py above the later hunk: the hunk's old-base place must
# undo it, or the helper upstream removed would look far away.
EARLIER = replace_line("f line 2\n", "f line 2\n" + "".join(f"fork_early_{i} = {i}\n" for i in range(10)))


def _base():
    f = numbered("f", 20) + HELPER + numbered("tail", 10)
    g = numbered("g", 30) + FIELD + numbered("gtail", 10)
    return {"f.py": f, "g.py": g, "h.py": numbered("h", 40)}


def test_reasons_name_the_upstream_commit_and_what_it_changed(tmp_path):
    repo = tmp_path / "repo"
    b0 = init(repo, _base(), "upstream 1.0")
    old_tip = branch_of_patches(repo, b0, [
        ({"h.py": replace_line("h line 2\n", "h line 2 fork\n"), "f.py": EARLIER}, "earlier patch on h"),
        ({"f.py": replace_line("tail line 1\n", "tail line 1\nuse(old_helper(3))\n")}, "use the helper"),
        ({"g.py": replace_line("gtail line 1\n", "gtail line 1\nread(cache_size)\n")}, "read the field"),
        ({"h.py": replace_line("h line 30\n", "h line 30 fork\n")}, "later patch on h"),
    ], "old")
    sh("git", "checkout", "-q", "main", cwd=repo)
    drop = commit(repo, {"f.py": replace_line(HELPER, "")}, "upstream: drop old_helper")
    rename = commit(repo, {"g.py": replace_line(FIELD, "    cache_entries: int = 0\n")}, "upstream: rename the field")
    commit(repo, {"h.py": replace_line("h line 10\n", "h line 10\n" + "extra\n" * 5)}, "upstream: grow h")
    near = commit(repo, {"h.py": replace_line("h line 28\n", "h line 28 upstream\n")}, "upstream: touch h 28")
    b1 = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    new_tip = branch_of_patches(repo, b1, [
        ({"h.py": replace_line("h line 2\n", "h line 2 fork\n"), "f.py": EARLIER}, "earlier patch on h"),
        ({"f.py": replace_line("tail line 1\n", "tail line 1\nuse(3 + 1)\n")}, "use the helper"),
        ({"g.py": replace_line("gtail line 1\n", "gtail line 1\nread(cache_entries)\n")}, "read the field"),
        ({"h.py": replace_line("h line 30\n", "h line 30 fork\n")}, "later patch on h"),
    ], "new")
    data = build_report(repo, b0, old_tip, b1, new_tip)
    rows = {r["new"][0]["subject"]: r for r in data["mapping"]}
    assert rows["use the helper"]["status"] == "modified"
    assert rows["use the helper"]["reasons"] == [
        f"upstream {drop[:12]} (upstream: drop old_helper) removed `old_helper` in `f.py` around the hunk"]
    assert rows["read the field"]["reasons"] == [
        f"upstream {rename[:12]} (upstream: rename the field) renamed `cache_size` to `cache_entries` in `g.py` "
        "around the hunk"]
    assert rows["later patch on h"]["status"] == "refreshed"
    assert rows["later patch on h"]["reasons"] == [
        f"upstream {near[:12]} (upstream: touch h 28) changed +1/-1 lines (`h line 28`) in `h.py` around the hunk"]
    assert "reasons" not in rows["earlier patch on h"]  # identical: nothing to explain
    md = render_markdown(data)
    assert f"Reason: upstream {drop[:12]} (upstream: drop old_helper) removed `old_helper`" in md


def test_reasons_without_history_come_from_the_bases_diff(tmp_path):
    repo = tmp_path / "repo"
    files = _base()
    b0 = init(repo, files, "release 1")
    old_tip = branch_of_patches(repo, b0, [
        ({"f.py": replace_line("tail line 1\n", "tail line 1\nuse(old_helper(3))\n")}, "use the helper")], "old")
    sh("git", "checkout", "-q", "--orphan", "rel2", cwd=repo)
    b1 = commit(repo, dict(files, **{"f.py": files["f.py"].replace(HELPER, "")}), "release 2")
    new_tip = branch_of_patches(repo, b1, [
        ({"f.py": replace_line("tail line 1\n", "tail line 1\nuse(3 + 1)\n")}, "use the helper")], "new2")
    (row,) = build_report(repo, b0, old_tip, b1, new_tip)["mapping"]
    assert row["reasons"] == [f"upstream {b1[:12]} (diff of the bases) removed `old_helper` in `f.py` around the hunk"]
