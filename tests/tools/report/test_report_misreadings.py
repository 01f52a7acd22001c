"""Four misreadings a reviewer met on real bumps (issue 45): trailer-only message changes, a patch
absorbed upstream whose remainder was folded into another patch, a patch upstream re-implemented,
and a group that is two stories. Plain branches without ``Patch-Name`` trailers, as another fork
keeps its stack."""

from tests.tools.bumpkit import append, branch_of_patches, commit, init, numbered, replace_line, sh
from tools.rebase.report.report import build_report


def block(tag, n, start=0):
    return "".join(f"{tag}_value_{i} = compute_{tag}(batch, {i})\n" for i in range(start, start + n))


def _rows(data):
    return {(r["new"] or r["old"])[0]["subject"]: r for r in data["mapping"]}


def test_trailer_only_changes_are_identical_or_renumbered(tmp_path):
    repo = tmp_path / "repo"
    b0 = init(repo, {f"{t}.py": numbered(t) for t in "fgh"}, "upstream 1.0")
    body = "Keeps the widget steady.\n\n"
    old_tip = branch_of_patches(repo, b0, [
        ({"f.py": append(block("steady", 4))}, f"[1/3] steady widget\n\n{body}Signed-off-by: Ann <a@x.invalid>"),
        ({"g.py": append(block("calm", 4))},
         f"[2/3] calm widget\n\n{body}Signed-off-by: Ann <a@x.invalid>\n\n(cherry picked from commit {'a' * 40})"),
        ({"h.py": append(block("words", 4))}, "[3/3] worded widget\n\nOld words.\n\nSigned-off-by: Ann <a@x.invalid>"),
    ], "old")
    new_tip = branch_of_patches(repo, b0, [
        ({"f.py": append(block("steady", 4))},
         f"[1/4] steady widget\n\n{body}Signed-off-by: Ann <a@x.invalid>\nCo-authored-by: Bo <b@x.invalid>"),
        ({"h.py": replace_line("h line 30\n", "h line 30 new\n")}, "[2/4] a new patch"),
        ({"g.py": append(block("calm", 4))}, f"[3/4] calm widget\n\n{body}Reviewed-by: Cy <c@x.invalid>"),
        ({"h.py": append(block("words", 4))}, "[4/4] worded widget\n\nNew words.\n\nSigned-off-by: Ann <a@x.invalid>"),
    ], "new")
    rows = _rows(build_report(repo, b0, old_tip, b0, new_tip))
    steady = rows["[1/4] steady widget"]
    assert steady["status"] == "identical", steady
    assert "trailers changed: +Co-authored-by: Bo <b@x.invalid>" in steady["note"]
    assert "series counter [1/3] -> [1/4]" in steady["note"]
    calm = rows["[3/4] calm widget"]
    assert calm["status"] == "renumbered", calm
    assert "+Reviewed-by: Cy <c@x.invalid>" in calm["note"] and "-Signed-off-by: Ann <a@x.invalid>" in calm["note"]
    assert f"-cherry-picked-from: {'a' * 40}" in calm["note"]
    assert rows["[4/4] worded widget"]["status"] == "message-only"  # the words changed: still a message edit
