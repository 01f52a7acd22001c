"""Report pairing on real-history shapes (issue 26, items 1, 2, 3 and 7), on plain branches without
``Patch-Name`` trailers (as another fork keeps its stack): counter-prefixed subjects, a squash whose
later half rewrote the earlier half, a split below half per part, a 3x3 regroup, an in-stack revert."""

from tests.tools.bumpkit import append, branch_of_patches, init, numbered, replace_line
from tools.rebase.report.report import build_report


def block(tag, n, start=0, scale=1):
    return "".join(f"{tag}_value_{i} = compute_{tag}({i} * {scale})\n" for i in range(start, start + n))


def _report(tmp_path, old, new, files="fghk"):
    repo = tmp_path / "repo"
    b0 = init(repo, {f"{t}.py": numbered(t) for t in files}, "upstream 1.0")
    old_tip = branch_of_patches(repo, b0, old, "old")
    new_tip = branch_of_patches(repo, b0, new, "new")
    return build_report(repo, b0, old_tip, b0, new_tip)


def _rows(data):
    return sorted((r["status"], [c["subject"] for c in r["old"]], [c["subject"] for c in r["new"]])
                  for r in data["mapping"])


def test_counter_prefixed_subjects_pair_when_the_content_changed_a_lot(tmp_path):
    data = _report(tmp_path, [
        ({"g.py": append("g_unrelated = 1\n")}, "[1/3] keep g"),
        ({"f.py": append(block("old_way", 8))}, "[2/3] fix: frobnicate the widget"),
    ], [
        ({"f.py": append(block("new_way", 30))}, "PATCH 5/6: fix: frobnicate the widget"),
    ])
    rows = _rows(data)
    assert ("modified", ["[2/3] fix: frobnicate the widget"], ["PATCH 5/6: fix: frobnicate the widget"]) in rows
    assert not [r for r in rows if r[0] == "new"]


def test_counter_stripped_subjects_still_need_a_common_file(tmp_path):
    data = _report(tmp_path, [({"f.py": append(block("one", 4))}, "[1/2] tidy up")],
                   [({"g.py": append(block("two", 4))}, "[2/2] tidy up")])
    assert sorted(r[0] for r in _rows(data)) == ["dropped", "new"]


def test_squash_where_the_later_commit_rewrote_the_earlier_ones_lines(tmp_path):
    first = block("alpha", 10)
    rewritten = block("alpha", 9, scale=2) + block("alpha", 1, start=9)  # 9 of 10 lines rewritten
    extra = block("alpha_extra", 3)
    data = _report(tmp_path, [
        ({"f.py": append(first)}, "feature alpha, first cut"),
        ({"f.py": lambda t: t.replace(first, rewritten) + extra}, "feature alpha: finish it"),
        ({"g.py": append(block("gamma", 5))}, "knob gamma (#211)"),
        ({"h.py": append(block("delta", 5))}, "knob delta (#212)"),
    ], [
        ({"f.py": append(rewritten + extra)}, "feature alpha"),
        ({"g.py": append(block("gamma_reworked", 5)), "h.py": append(block("delta", 5))},
         "knobs gamma and delta\n\nSquash of #211 and #212."),
    ])
    rows = {tuple(r[1]): r for r in _rows(data)}
    assert rows[("feature alpha, first cut", "feature alpha: finish it")][:1] == ("merged",)
    row = next(r for r in data["mapping"] if len(r["old"]) == 2 and r["new"][0]["subject"] == "feature alpha")
    assert "old #1: #2 rewrote 9 of its 10 added lines; squashed" in row["note"]
    # the squashed message names the PR of a part whose text it does not share
    knobs = rows[("knob gamma (#211)", "knob delta (#212)")]
    assert knobs[0] == "merged" and knobs[2] == ["knobs gamma and delta"]
    assert not [r for r in data["mapping"] if r["status"] == "dropped"]


def test_three_way_split_below_half_per_part(tmp_path):
    part1, part2, part3 = block("split_a", 9), block("split_b", 6), block("split_c", 5)
    data = _report(tmp_path, [({"f.py": append(part1), "g.py": append(part2), "h.py": append(part3)},
                               "big feature")], [
        ({"f.py": append(part1 + block("own_p1", 3))}, "big feature, part 1"),
        ({"g.py": append(part2)}, "big feature, part 2"),
        ({"h.py": append(part3 + block("own_p3", 6))}, "big feature, part 3"),
    ])
    (row,) = data["mapping"]
    assert row["status"] == "split" and [c["subject"] for c in row["new"]] == [
        "big feature, part 1", "big feature, part 2", "big feature, part 3"]
    assert row["edges"] == [[1, 1, 9, 0.45, 0.75], [1, 2, 6, 0.3, 1.0], [1, 3, 5, 0.25, 0.45]]
    assert "old #1 -> new #3: 5 lines (25% of old #1, 45% of new #3)" in row["note"]


def test_three_by_three_regroup_is_one_group(tmp_path):
    x, y, z = (block(t, 10) for t in ("xray", "yank", "zulu"))

    def part(text, lo, hi):
        return "".join(text.splitlines(True)[lo:hi])
    data = _report(tmp_path, [
        ({"f.py": append(x)}, "x feature"), ({"g.py": append(y)}, "y feature"), ({"h.py": append(z)}, "z feature"),
    ], [
        ({"f.py": append(part(x, 0, 7)), "g.py": append(part(y, 7, 10))}, "x feature, regrouped"),
        ({"g.py": append(part(y, 0, 7)), "h.py": append(part(z, 7, 10))}, "y feature, regrouped"),
        ({"h.py": append(part(z, 0, 7)), "f.py": lambda t: t + part(x, 7, 10)}, "z feature, regrouped"),
    ])
    (row,) = data["mapping"]
    assert row["status"] == "regrouped" and len(row["old"]) == len(row["new"]) == 3
    assert "regrouped" in row["note"]
    assert sorted(tuple(e[:3]) for e in row["edges"]) == [
        (1, 1, 7), (1, 3, 3), (2, 1, 3), (2, 2, 7), (3, 2, 3), (3, 3, 7)]


def test_in_stack_revert_pairs_on_each_commits_own_diff(tmp_path):
    feature = block("feat", 10)
    kept = "".join(feature.splitlines(True)[:6])
    taken = "".join(feature.splitlines(True)[6:])
    revert = ({"f.py": replace_line(taken, "")}, "Revert part of \"feature\"")
    data = _report(tmp_path, [
        ({"f.py": append(feature)}, "feature"),
        ({"g.py": append(block("other", 4))}, "other"),
        revert,
    ], [
        ({"f.py": append(feature)}, "feature"),
        ({"g.py": append(block("other", 4))}, "other"),
        revert,
        ({"f.py": lambda t: t.replace(kept, feature)}, "Reapply the rest of \"feature\""),
    ])
    rows = {(r["status"], tuple(c["subject"] for c in r["old"]), tuple(c["subject"] for c in r["new"])): r
            for r in data["mapping"]}
    assert set(rows) == {
        ("identical", ("feature",), ("feature",)), ("identical", ("other",), ("other",)),
        ("identical", ("Revert part of \"feature\"",), ("Revert part of \"feature\"",)),
        ("new", (), ("Reapply the rest of \"feature\"",)),
    }
    revert_row = rows[("identical", ("Revert part of \"feature\"",), ("Revert part of \"feature\"",))]
    assert "in-stack revert: takes back 4 lines #1 added in the old stack" in revert_row["note"]
    assert "undoes the in-stack revert #3 of the new stack" in rows[("new", (), ("Reapply the rest of \"feature\"",))]["note"]


def test_a_part_rewritten_elsewhere_joins_its_neighbours_squash_by_the_message(tmp_path):
    """Old #1 edits g.py, old #2 adds the feature; the new commit does #1's job inline in f.py with
    other text and says so in its message: #1 folded into it, not dropped."""
    data = _report(tmp_path, [
        ({"g.py": append(block("detach_params", 3))}, "[1/2] detach output layer params"),
        ({"f.py": append(block("mtp_train", 8))}, "[2/2] support MTP training"),
    ], [
        ({"f.py": append(block("mtp_train", 8) + block("inline_detached", 3))},
         "[1/1] support MTP training\n\nAlso detach the output layer params at the call site."),
    ])
    (row,) = data["mapping"]
    assert row["status"] == "merged" and len(row["old"]) == 2
    assert "old #1: new #1 its message describes it (detach, layer, output, params); squashed with a neighbour" in row["note"]


def test_a_neighbours_message_without_the_words_leaves_it_dropped(tmp_path):
    data = _report(tmp_path, [
        ({"g.py": append(block("detach_params", 3))}, "[1/2] detach output layer params"),
        ({"f.py": append(block("mtp_train", 8))}, "[2/2] support MTP training"),
    ], [({"f.py": append(block("mtp_train", 8))}, "[1/1] support MTP training\n\nNothing else.")])
    assert sorted(r["status"] for r in data["mapping"]) == ["dropped", "message-only"]


def test_a_few_shared_lines_do_not_fold_a_dropped_commit_into_a_paired_one(tmp_path):
    shared = block("common", 2)
    data = _report(tmp_path, [
        ({"f.py": append(block("keep", 8) + shared)}, "keeper"),
        ({"g.py": append(shared + block("gone", 6))}, "gone for good"),
    ], [({"f.py": append(block("keep", 8) + shared)}, "keeper")])
    assert sorted((r["status"], r["old"][0]["subject"]) for r in data["mapping"]) == [
        ("dropped", "gone for good"), ("identical", "keeper")]
