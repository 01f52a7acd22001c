"""Three misreadings on held-out history (issue 57, item 4): a patch the fork dropped whose code
upstream touched without making its change, an upstream version of a patch whose commit was found,
and two unrelated old commits regrouped into one new commit. Plain branches without trailers."""

from tests.tools.bumpkit import append, branch_of_patches, commit, init, numbered, replace_line, sh
from tools.rebase.report.report import build_report

TRAIN = ("def train_step(model, batch, optimizer):\n"
         "    loss = model(batch)\n"
         "    loss.backward()\n"
         "    optimizer.step()\n"
         "    return loss\n\n\n"
         "def eval_step(model, batch):\n    return model(batch)\n")
ROUTER = ("def route_tokens(logits, topk):\n"
          "    scores = logits.softmax(dim=-1)\n"
          "    picked = scores.topk(topk)\n"
          "    return picked.indices\n")


def block(tag, n, start=0):
    return "".join(f"{tag}_value_{i} = compute_{tag}(batch, {i})\n" for i in range(start, start + n))


def _report(tmp_path, files, old, upstream, new):
    """Old stack ``old`` on the base, ``upstream`` commits on main (``[(edits, message)]``), new stack
    ``new`` on main's tip. Returns the rows by first old (else new) subject and the upstream ids."""
    repo = tmp_path / "repo"
    b0 = init(repo, {**{f"{t}.py": numbered(t) for t in "fgh"}, **files}, "upstream 1.0")
    old_tip = branch_of_patches(repo, b0, old, "old")
    sh("git", "checkout", "-q", "main", cwd=repo)
    ups = [commit(repo, edits, message) for edits, message in upstream]
    b1 = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    new_tip = branch_of_patches(repo, b1, new, "new")
    data = build_report(repo, b0, old_tip, b1, new_tip)
    return {(r["old"] or r["new"])[0]["subject"]: r for r in data["mapping"]}, ups


# ------------------------------------------------------------------ (a) dropped, upstream touched it


def test_a_dropped_fix_whose_lines_upstream_left_in_place_is_dropped(tmp_path):
    """The fork changed one line of ``train_step``; upstream changed its neighbour, for a purpose its
    subject shares. The fork's removed line is still in the new base and its added line is not:
    upstream did not make this change, whatever it touched."""
    rows, (theirs,) = _report(tmp_path, {"train.py": TRAIN}, [
        ({"train.py": replace_line("    optimizer.step()\n", "    optimizer.step(closure=None)\n")},
         "train step: pass the optimizer closure"),
    ], [
        ({"train.py": replace_line("    loss.backward()\n", "    loss.backward(retain_graph=False)\n")},
         "Train step: tidy the optimizer backward (#300)"),
    ], [({"g.py": append("g_other = 1\n")}, "something new")])
    row = rows["train step: pass the optimizer closure"]
    assert row["status"] == "dropped" and "upstream_commit" not in row, row
    assert f"upstream {theirs[:12]} (Train step: tidy the optimizer backward (#300)) touched the same code" in row["note"]
    assert "0 of its 1 added lines are in the new base, 1 of its 1 removed lines are still there" in row["note"]


def test_a_dropped_addition_in_a_function_upstream_changed_is_dropped(tmp_path):
    """The fork called its own rollout hook from ``train_step`` and later moved that to its RL
    framework (the new stack lacks it); upstream reworked ``train_step`` for its own reasons. None
    of the fork's lines and none of its new names are in the new base."""
    rows, _ = _report(tmp_path, {"train.py": TRAIN}, [
        ({"train.py": replace_line("    optimizer.step()\n",
                                   "    optimizer.step()\n    rollout_sync_hook(model, rollout_buffer_state)\n")},
         "train step: call the rollout sync hook"),
    ], [
        ({"train.py": replace_line("    optimizer.step()\n    return loss\n",
                                   "    optimizer.step()\n    optimizer.zero_grad(set_to_none=True)\n"
                                   "    return loss.detach()\n")},
         "Train step: clear gradients after the step (#301)"),
    ], [({"g.py": append("g_other = 1\n")}, "something new")])
    row = rows["train step: call the rollout sync hook"]
    assert row["status"] == "dropped" and "upstream_commit" not in row, row
    assert "0 of the 2 names it introduced exist there" in row["note"]


def test_a_re_implementation_in_the_lines_it_changed_stays_likely_absorbed(tmp_path):
    """Control: upstream replaced the very line the fork changed, for the same purpose, in other
    words: the removed line is gone, so the re-implementation reading stands."""
    rows, (theirs,) = _report(tmp_path, {"train.py": TRAIN}, [
        ({"train.py": replace_line("    return loss\n", "    return loss.detach()\n")},
         "train step: return a detached loss"),
    ], [
        ({"train.py": replace_line("    return loss\n", "    return loss.detach().clone()\n")},
         "Train step: return the loss detached (#302)"),
    ], [({"g.py": append("g_other = 1\n")}, "something new")])
    row = rows["train step: return a detached loss"]
    assert row["status"] == "likely-absorbed" and row["upstream_commit"] == theirs, row


# ------------------------------------------------------------------ (b) found upstream commit: absorbed


def test_upstream_s_own_version_of_the_patch_is_absorbed_by_its_commit(tmp_path):
    """Upstream took the fork's router change in its reviewed version: the same two lines replaced,
    one of the fork's three new lines kept word for word, the others reworded (too few shared lines
    for a text match). Its commit is found and the new base carries the change: absorbed by that
    commit, not "likely"."""
    rows, (theirs,) = _report(tmp_path, {"router.py": ROUTER}, [
        ({"router.py": replace_line("    scores = logits.softmax(dim=-1)\n    picked = scores.topk(topk)\n",
                                    "    scores = logits.float().softmax(dim=-1)\n"
                                    "    scores = scores.clamp_min(1e-9)\n"
                                    "    picked = scores.topk(topk, sorted=True)\n")},
         "router: softmax in fp32 and sorted top-k"),
    ], [
        ({"router.py": replace_line("    scores = logits.softmax(dim=-1)\n    picked = scores.topk(topk)\n",
                                    "    scores = logits.float().softmax(dim=-1)\n"
                                    "    scores = torch.clamp(scores, min=1e-9)\n"
                                    "    picked = torch.topk(scores, k=topk, sorted=True)\n")},
         "Router: fp32 softmax, sorted top-k (#7001)"),
    ], [({"g.py": append("g_other = 1\n")}, "something new")])
    row = rows["router: softmax in fp32 and sorted top-k"]
    assert row["status"] == "absorbed" and row["upstream_commit"] == theirs, row
    assert "1 of its 3 added lines are in the new base, 0 of its 2 removed lines are still there" in row["note"]


def test_a_cherry_pick_is_absorbed_by_the_commit_it_names(tmp_path):
    """The fork carried a pick of an upstream fix (its resolution changed the text); the new base
    contains that very commit: absorbed by it, named by identity."""
    repo = tmp_path / "repo"
    b0 = init(repo, {"router.py": ROUTER, "g.py": numbered("g")}, "upstream 1.0")
    sh("git", "checkout", "-q", "-b", "dev", b0, cwd=repo)
    fix = commit(repo, {"router.py": replace_line("    return picked.indices\n",
                                                  "    return picked.indices.long()\n")},
                 "Router: return int64 indices (#7002)")
    sh("git", "checkout", "-q", "main", cwd=repo)
    old_tip = branch_of_patches(repo, b0, [
        ({"router.py": replace_line("    return picked.indices\n", "    return picked.indices.to(torch.int64)\n")},
         f"Router: return int64 indices (#7002)\n\n(cherry picked from commit {fix})"),
    ], "old")
    sh("git", "checkout", "-q", "main", cwd=repo)
    sh("git", "merge", "-q", "--ff-only", "dev", cwd=repo)
    new_tip = branch_of_patches(repo, fix, [({"g.py": append("g_other = 1\n")}, "something new")], "new")
    data = build_report(repo, b0, old_tip, fix, new_tip)
    row = next(r for r in data["mapping"] if r["old"])
    assert row["status"] == "absorbed" and row["upstream_commit"] == fix, row
    assert "cherry-picked from it" in row["note"]


# ------------------------------------------------------------------ (c) regrouped, not merged


def _same_base(tmp_path, old, new):
    repo = tmp_path / "repo"
    b0 = init(repo, {f"{t}.py": numbered(t) for t in "fghk"}, "upstream 1.0")
    old_tip = branch_of_patches(repo, b0, old, "old")
    new_tip = branch_of_patches(repo, b0, new, "new")
    return build_report(repo, b0, old_tip, b0, new_tip)["mapping"]


def _shape(mapping):
    return sorted((r["status"], [c["subject"] for c in r["old"]], [c["subject"] for c in r["new"]]) for r in mapping)


ROUTE, CKPT, DOCS = block("route_fp32", 6), block("ckpt_async", 6), block("docs_links", 5)


def test_two_unrelated_commits_put_together_are_regrouped(tmp_path):
    """Old #1 (router) and old #3 (docs) are no neighbours (old #2 lives on in its own new commit),
    share no topic, no rewrite links them, and the new commit's message names neither: a regroup."""
    mapping = _same_base(tmp_path, [
        ({"f.py": append(ROUTE)}, "router: fp32 logits"),
        ({"g.py": append(CKPT)}, "checkpoint: async save"),
        ({"h.py": append(DOCS)}, "docs: fix broken links"),
    ], [
        ({"g.py": append(CKPT)}, "checkpoint: async save"),
        ({"f.py": append(ROUTE), "h.py": append(DOCS)}, "RL numerics bundle\n\nWhat the RL recipes need."),
    ])
    assert _shape(mapping) == [
        ("regrouped", ["router: fp32 logits", "docs: fix broken links"], ["RL numerics bundle"]),
        ("renumbered", ["checkpoint: async save"], ["checkpoint: async save"]),
    ], mapping
    row = next(r for r in mapping if r["status"] == "regrouped")
    assert "regrouped: old #1, #3 now in new #2, not one change" in row["note"]


def test_a_squash_of_neighbours_or_of_one_topic_or_named_stays_merged(tmp_path):
    """Controls for the regroup rule: neighbours folded together, a fix-up of the same topic from
    further down the stack, and a concatenated message are squashes."""
    fixup = block("route_fp32_fixup", 3)
    mapping = _same_base(tmp_path, [
        ({"f.py": append(ROUTE)}, "router: fp32 logits"),
        ({"g.py": append(CKPT)}, "checkpoint: async save"),
        ({"f.py": append(fixup)}, "router: fp32 logits for the aux loss too"),
        ({"h.py": append(DOCS)}, "docs: fix broken links"),
        ({"k.py": append(block("cli_flags", 5))}, "cli: parse the new flags"),
    ], [
        ({"f.py": append(ROUTE + fixup)}, "router: fp32 logits"),
        ({"g.py": append(CKPT), "k.py": append(block("cli_flags", 5))},
         "checkpoint: async save\n\nAlso: cli: parse the new flags."),
        ({"h.py": append(DOCS)}, "docs: fix broken links"),
    ])
    shape = _shape(mapping)
    assert ("merged", ["router: fp32 logits", "router: fp32 logits for the aux loss too"],
            ["router: fp32 logits"]) in shape, shape
    assert ("merged", ["checkpoint: async save", "cli: parse the new flags"], ["checkpoint: async save"]) in shape
    assert not [r for r in shape if r[0] == "regrouped"]


# ------------------------------------------------------------------ lines that cannot place a commit alone


MARK = "@pytest.mark.internal\n"


def _tests_file(tag):
    return "import pytest\n\n\n" + "".join(f"def test_{tag}_{i}():\n    assert True\n\n\n" for i in range(6))


def test_a_marker_line_other_commits_repeat_goes_with_its_file(tmp_path):
    """Old #1 marks a test in t1.py with a line old #3 also adds in t2.py and t3.py; old #1 and old
    #4 went into one new commit: old #1's line is traced by the file it is in, not shared out."""
    repo = tmp_path / "repo"
    b0 = init(repo, {"t1.py": _tests_file("a"), "t2.py": _tests_file("b"), "t3.py": _tests_file("c"),
                     "f.py": numbered("f"), "g.py": numbered("g")}, "upstream 1.0")
    mark_a = replace_line("def test_a_2", MARK + "def test_a_2")
    mark_b = {"t2.py": replace_line("def test_b_1", MARK + "def test_b_1"),
              "t3.py": replace_line("def test_c_4", MARK + "def test_c_4")}
    old_tip = branch_of_patches(repo, b0, [
        ({"t1.py": mark_a}, "tests: mark the slow a-test internal"),
        ({"f.py": append(ROUTE)}, "router: fp32 logits"),
        ({**mark_b, "g.py": append(CKPT)}, "checkpoint: async save, its tests internal"),
        ({"f.py": append(DOCS)}, "docs: fix broken links"),
    ], "old")
    new_tip = branch_of_patches(repo, b0, [
        ({"f.py": append(ROUTE)}, "router: fp32 logits"),
        ({**mark_b, "g.py": append(CKPT)}, "checkpoint: async save, its tests internal"),
        ({"t1.py": mark_a, "f.py": append(DOCS)}, "Release cleanups"),
    ], "new")
    shape = _shape(build_report(repo, b0, old_tip, b0, new_tip)["mapping"])
    assert ("regrouped", ["tests: mark the slow a-test internal", "docs: fix broken links"], ["Release cleanups"]) \
        in shape, shape


def test_a_commit_that_only_removes_lines_is_traced_into_a_commit_that_adds(tmp_path):
    """Old #1 only removes an unused name from an import list; the new commit that holds old #2's
    feature removes it too: merged with its neighbour, not dropped."""
    repo = tmp_path / "repo"
    b0 = init(repo, {"f.py": "from engine import (\n    ChunkOverflowError,\n    DynamicEngine,\n)\n" + numbered("f"),
                     "g.py": numbered("g")}, "upstream 1.0")
    unused = replace_line("    ChunkOverflowError,\n", "")
    old_tip = branch_of_patches(repo, b0, [
        ({"f.py": unused}, "Remove the unused ChunkOverflowError import"),
        ({"g.py": append(CKPT)}, "checkpoint: async save"),
    ], "old")
    new_tip = branch_of_patches(repo, b0, [({"f.py": unused, "g.py": append(CKPT)}, "checkpoint: async save")], "new")
    shape = _shape(build_report(repo, b0, old_tip, b0, new_tip)["mapping"])
    assert shape == [("merged", ["Remove the unused ChunkOverflowError import", "checkpoint: async save"],
                      ["checkpoint: async save"])], shape


def test_marker_lines_upstream_added_elsewhere_in_the_file_are_not_the_patch_s(tmp_path):
    """Upstream marked other tests of the same file with the line the patch adds; the new stack still
    marks the patch's own test, in a commit regrouped with another: the patch went there, it was not
    absorbed upstream."""
    repo = tmp_path / "repo"
    b0 = init(repo, {"t1.py": _tests_file("a"), "f.py": numbered("f"), "h.py": numbered("h")}, "upstream 1.0")
    mine = replace_line("def test_a_2", MARK + "def test_a_2")
    old_tip = branch_of_patches(repo, b0, [
        ({"t1.py": mine}, "tests: mark a-2 internal"),
        ({"f.py": append(ROUTE)}, "router: fp32 logits"),
        ({"h.py": append(DOCS)}, "docs: fix broken links"),
    ], "old")
    sh("git", "checkout", "-q", "main", cwd=repo)
    commit(repo, {"t1.py": lambda t: t.replace("def test_a_4", MARK + "def test_a_4").replace(
        "def test_a_5", MARK + "def test_a_5")}, "Mark tests 4 and 5 internal (#88)")
    b1 = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    new_tip = branch_of_patches(repo, b1, [
        ({"f.py": append(ROUTE)}, "router: fp32 logits"),
        ({"t1.py": mine, "h.py": append(DOCS)}, "Release cleanups"),
    ], "new")
    shape = _shape(build_report(repo, b0, old_tip, b1, new_tip)["mapping"])
    assert ("regrouped", ["tests: mark a-2 internal", "docs: fix broken links"], ["Release cleanups"]) in shape, shape


def test_a_squash_put_together_with_an_unrelated_commit_is_a_regroup(tmp_path):
    """Old #1 and its rewrite #2 are one change; old #4 is another, with old #3 (carried on its own)
    between: the links join #1 and #2 but not #4, so the new commit holding all three regroups."""
    first = block("route_fp32", 6)
    rewritten = block("route_fp32_v2", 6)
    mapping = _same_base(tmp_path, [
        ({"f.py": append(first)}, "router: fp32 logits"),
        ({"f.py": lambda t: t.replace(first, rewritten)}, "router: redo it with the v2 kernel"),
        ({"g.py": append(CKPT)}, "checkpoint: async save"),
        ({"h.py": append(DOCS)}, "docs: fix broken links"),
    ], [
        ({"g.py": append(CKPT)}, "checkpoint: async save"),
        ({"f.py": append(rewritten), "h.py": append(DOCS)}, "Release cleanups"),
    ])
    row = next(r for r in mapping if len(r["old"]) > 1)
    assert row["status"] == "regrouped" and [c["subject"] for c in row["old"]] == [
        "router: fp32 logits", "router: redo it with the v2 kernel", "docs: fix broken links"], row


def test_a_dropped_reapply_is_not_squashed_into_the_revert_that_names_it(tmp_path):
    """Old #1 reverts an upstream change and old #2 re-applies it; the fork dropped the re-apply.
    The revert's message names the same PR, but a re-apply cannot be squashed into its revert."""
    repo = tmp_path / "repo"
    b0 = init(repo, {"f.py": numbered("f") + ROUTE, "g.py": numbered("g")}, "upstream 1.0")
    revert = ({"f.py": replace_line(ROUTE, "")}, 'Revert "router: fp32 logits (#50)"\n\nThis reverts PR #50.')
    old_tip = branch_of_patches(repo, b0, [
        revert, ({"f.py": append(ROUTE)}, 'Reapply "router: fp32 logits (#50)"'),
        ({"g.py": append(CKPT)}, "checkpoint: async save"),
    ], "old")
    new_tip = branch_of_patches(repo, b0, [revert, ({"g.py": append(CKPT)}, "checkpoint: async save")], "new")
    shape = _shape(build_report(repo, b0, old_tip, b0, new_tip)["mapping"])
    assert ("dropped", ['Reapply "router: fp32 logits (#50)"'], []) in shape, shape
