"""Partial absorption named (issue 15, item 2): a hunk missing from a patch's new version names the
upstream commit that made the same change, or deleted or moved the file; a patch absorbed in
pieces by several commits names them all."""

from tests.tools.bumpkit import branch_of_patches, commit, init, numbered, patch_msg, replace_line, sh
from tools.rebase.report.report import build_report


def test_missing_parts_and_pieces_name_their_upstream_commits(tmp_path):
    repo = tmp_path / "repo"
    b0 = init(repo, {f"{t}.py": numbered(t) for t in "fghkmn"}, "upstream 1.0")
    f_edit = {"f.py": replace_line("f line 4\n", "f line 4 fork\n")}
    g_edit = {"g.py": replace_line("g line 8\n", "g line 8 fork\ng extra fork\n")}
    k_edit = {"k.py": replace_line("k line 2\n", "k line 2 fork\n")}
    h_edit = {"h.py": replace_line("h line 6\n", "h line 6 fork\n")}
    m_edit = {"m.py": replace_line("m line 9\n", "m line 9 fork one\nm more fork\n")}
    n_edit = {"n.py": replace_line("n line 9\n", "n line 9 fork two\nn more fork\n")}
    old_tip = branch_of_patches(repo, b0, [
        ({**f_edit, **g_edit}, patch_msg("same-change")),
        ({**k_edit, **h_edit}, patch_msg("file-moved")),
        ({**m_edit, **n_edit}, patch_msg("in-pieces")),
    ], "old")
    sh("git", "checkout", "-q", "main", cwd=repo)
    same = commit(repo, g_edit, "upstream: the same g.py change")
    sh("git", "mv", "h.py", "h_moved.py", cwd=repo)
    moved = commit(repo, {}, "upstream: move h.py")
    piece1 = commit(repo, m_edit, "upstream: m.py part")
    piece2 = commit(repo, n_edit, "upstream: n.py part")
    b1 = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    new_tip = branch_of_patches(repo, b1, [(f_edit, patch_msg("same-change")), (k_edit, patch_msg("file-moved"))], "new")

    rows = {e["patch_name"]: e for e in build_report(repo, b0, old_tip, b1, new_tip)["mapping"]}
    assert rows["same-change"]["status"] == "modified"
    assert f"its change to `g.py` made upstream in {same[:12]}" in rows["same-change"]["note"]
    assert rows["same-change"]["partially_absorbed_by"] == [same]
    assert f"`h.py` moved to `h_moved.py` upstream in {moved[:12]}" in rows["file-moved"]["note"]
    assert rows["in-pieces"]["status"] == "absorbed"
    assert rows["in-pieces"]["upstream_commits"] == [piece1, piece2]
    assert f"in pieces by {piece1[:12]}, {piece2[:12]}" in rows["in-pieces"]["note"]
