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


def test_absorbed_then_folded_names_upstream_and_where_the_rest_went(tmp_path):
    """Old #1 adds ten lines; upstream took six of them, and the other four now live in the new
    commit that carries old #2. Lines already in the new base are absorption, not pairing."""
    repo = tmp_path / "repo"
    b0 = init(repo, {f"{t}.py": numbered(t) for t in "fgh"}, "upstream 1.0")
    taken, rest = block("router_cap", 6), block("router_cap", 4, start=6)
    old_tip = branch_of_patches(repo, b0, [
        ({"f.py": replace_line("f line 20\n", "f line 20\n" + taken + rest)}, "cap the router load"),
        ({"g.py": append(block("replay", 8))}, "routing replay"),
    ], "old")
    sh("git", "checkout", "-q", "main", cwd=repo)
    commit(repo, {"h.py": replace_line("h line 3\n", "h line 3 upstream\n")}, "upstream: unrelated")
    upstream = commit(repo, {"f.py": replace_line("f line 20\n", "f line 20\n" + taken)}, "Cap router load (#812)")
    b1 = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    new_tip = branch_of_patches(repo, b1, [
        ({"g.py": append(block("replay", 8)), "f.py": replace_line(taken, taken + rest)}, "routing replay"),
    ], "new")
    data = build_report(repo, b0, old_tip, b1, new_tip)
    rows = {(r["old"] or r["new"])[0]["subject"]: r for r in data["mapping"]}
    cap = rows["cap the router load"]
    assert cap["status"] == "absorbed" and cap["new"] == [], cap
    assert cap["upstream_commit"] == upstream
    assert cap["note"].startswith(f"partially absorbed upstream in {upstream[:12]} (6 of its 10 added lines")
    assert "the other 4 added lines folded into new #1 (routing replay)" in cap["note"]
    assert cap["folded_into"] == [{"commit": new_tip, "subject": "routing replay"}]
    replay = rows["routing replay"]
    assert replay["status"] == "modified" and [c["subject"] for c in replay["old"]] == ["routing replay"]


def test_wholly_absorbed_commit_is_not_paired_with_a_new_one(tmp_path):
    """All of old #1's lines are in the new base; a new commit adding a copy of two of them elsewhere
    is no partner."""
    repo = tmp_path / "repo"
    b0 = init(repo, {f"{t}.py": numbered(t) for t in "fgh"}, "upstream 1.0")
    lines = block("clip_grad", 4)
    old_tip = branch_of_patches(repo, b0, [({"f.py": append(lines)}, "clip gradients")], "old")
    sh("git", "checkout", "-q", "main", cwd=repo)
    upstream = commit(repo, {"f.py": append(lines)}, "Clip gradients upstream (#77)")
    b1 = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    new_tip = branch_of_patches(repo, b1, [({"g.py": append(block("clip_grad", 2) + block("other", 1))},
                                            "reuse clipping in g")], "new")
    data = build_report(repo, b0, old_tip, b1, new_tip)
    rows = {(r["old"] or r["new"])[0]["subject"]: r for r in data["mapping"]}
    assert rows["clip gradients"]["status"] == "absorbed" and rows["clip gradients"]["upstream_commit"] == upstream
    assert rows["reuse clipping in g"]["status"] == "new"


LOSS = ("def load_balancing_loss(aux, coeff, num_layers):\n"
        "    scaled_aux = aux * coeff\n"
        "    return scaled_aux\n\n\n"
        "def unrelated_helper(value):\n    return value\n")


def test_reimplemented_in_the_same_function_is_likely_absorbed(tmp_path):
    """Old #1 changes an existing function (no new name, no shared line); upstream fixed the same
    function its own way: likely absorbed by that commit. Old #2 has no upstream counterpart: the row
    says the search found nothing."""
    repo = tmp_path / "repo"
    b0 = init(repo, {"loss.py": LOSS, "g.py": numbered("g")}, "upstream 1.0")
    old_tip = branch_of_patches(repo, b0, [
        ({"loss.py": replace_line("    return scaled_aux\n", "    return scaled_aux / num_layers\n")},
         "[1/2] normalize the load balancing loss per layer"),
        ({"g.py": replace_line("g line 4\n", "g line 4 fork_only_switch = True\n")}, "[2/2] fork-only switch"),
    ], "old")
    sh("git", "checkout", "-q", "main", cwd=repo)
    commit(repo, {"loss.py": replace_line("def unrelated_helper(value):\n    return value\n",
                                          "def unrelated_helper(value):\n    return value + 0\n")},
           "upstream: tidy the helper")
    theirs = commit(repo, {"loss.py": replace_line(
        "    scaled_aux = aux * coeff\n    return scaled_aux\n",
        "    denom = max(num_layers, 1)\n    return aux * coeff / denom\n")},
        "Normalize load balancing loss by the layer count (#901)")
    b1 = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    new_tip = branch_of_patches(repo, b1, [({"g.py": append("g_new = 1\n")}, "[1/1] something new")], "new")
    rows = {(r["old"] or r["new"])[0]["subject"]: r for r in build_report(repo, b0, old_tip, b1, new_tip)["mapping"]}
    row = rows["[1/2] normalize the load balancing loss per layer"]
    assert row["status"] == "likely-absorbed" and row["upstream_commit"] == theirs, row
    assert "changes `load_balancing_loss` in `loss.py` too" in row["note"]
    assert "its subject shares balancing, layer, load, loss, normalize" in row["note"]
    gone = rows["[2/2] fork-only switch"]
    assert gone["status"] == "dropped" and "upstream_commit" not in gone
    assert gone["note"].startswith("not in the new stack; no upstream change found")
    assert "the 0 upstream commits touching `g.py`" in gone["note"]


def test_a_group_of_two_stories_is_cut_at_its_weak_link(tmp_path):
    """Old #1 split into three new commits; old #2 went to its own new commit except three lines that
    landed in the second part of the split. Two stories: a split and a modified pair."""
    a1, a2, a3 = block("sched_warm", 6), block("sched_decay", 4), block("sched_floor", 5)
    b_main, b_bit = block("ckpt_async", 7), block("ckpt_flush", 3)
    data = _report_plain(tmp_path, [
        ({"f.py": append(a1 + a2 + a3)}, "lr schedule"),
        ({"g.py": append(b_main + b_bit)}, "async checkpoints"),
    ], [
        ({"f.py": append(a1)}, "lr schedule: warmup"),
        ({"h.py": append(a2 + b_bit)}, "lr schedule: decay"),
        ({"f.py": lambda t: t + a3}, "lr schedule: floor"),
        ({"g.py": append(b_main)}, "async checkpoints"),
    ])
    rows = sorted((r["status"], [c["subject"] for c in r["old"]], [c["subject"] for c in r["new"]], r["note"])
                  for r in data["mapping"])
    assert [r[:3] for r in rows] == [
        ("modified", ["async checkpoints"], ["async checkpoints"]),
        ("split", ["lr schedule"], ["lr schedule: warmup", "lr schedule: decay", "lr schedule: floor"]),
    ], rows
    weak = "weak link old #2 -> new #2 (3 lines, 30% of old #2, 43% of new #2) left out: a separate story"
    assert all(weak in r[3] for r in rows)


def test_a_regroup_cycle_of_weak_edges_stays_one_group(tmp_path):
    """Each weak edge of a 2x2 regroup sits in a cycle: cutting one leaves the group whole."""
    x, y = block("xray", 10), block("yank", 10)
    data = _report_plain(tmp_path, [({"f.py": append(x)}, "x feature"), ({"g.py": append(y)}, "y feature")], [
        ({"f.py": append(x[: x.index("xray_value_7")]), "g.py": append(y[y.index("yank_value_7"):])}, "x, regrouped"),
        ({"g.py": append(y[: y.index("yank_value_7")]), "f.py": append(x[x.index("xray_value_7"):])}, "y, regrouped"),
    ])
    (row,) = data["mapping"]
    assert row["status"] == "regrouped" and "weak link" not in row["note"]


def _report_plain(tmp_path, old, new):
    repo = tmp_path / "repo"
    b0 = init(repo, {f"{t}.py": numbered(t) for t in "fgh"}, "upstream 1.0")
    old_tip = branch_of_patches(repo, b0, old, "old")
    new_tip = branch_of_patches(repo, b0, new, "new")
    return build_report(repo, b0, old_tip, b0, new_tip)
