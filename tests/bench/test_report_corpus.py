"""The corpus benchmark's answer key (bench/report_corpus.py): which branch commit is a pick of
which main commit by the PR numbers in subjects, the replay that rebuilds stacks without a work tree,
and the scoring of a report against the key. A small synthetic repo; the mirror test skips without it."""

import pytest

from bench import report_corpus as rc
from tests.tools.bumpkit import append, commit, init, numbered, replace_line, sh


def test_pr_numbers_of_pick_subjects():
    assert rc.own_pr("Fix the widget (#6520)") == "6520" and rc.own_pr("Fix it (#12) later") == ""
    assert rc.referenced_prs("cp: `Update release notes page (6520)` into `core_r0.19.0` (#6592)") == {"6520"}
    assert rc.referenced_prs("[dev] Refactor GDN (cherry-pick #5843) (#6088)") == {"5843"}
    assert rc.referenced_prs("cp: additional tests for nvrx (#4522) (#4826)") == {"4522"}
    assert rc.referenced_prs("Plain change (#77)") == set()
    assert rc.referenced_prs("Port the fix (#90)", "Cherry-picked from #1234 on dev.") == {"1234"}


def _repo(tmp_path):
    repo = tmp_path / "repo"
    b0 = init(repo, {"a.py": numbered("a"), "b.py": numbered("b")}, "base (#100)")
    alpha = commit(repo, {"a.py": replace_line("a line 3\n", "a line 3 alpha\n")}, "feat: alpha (#101)")
    beta = commit(repo, {"b.py": replace_line("b line 9\n", "b line 9 beta\n")}, "fix: beta (#102)")
    sh("git", "checkout", "-q", "-b", "rel", b0, cwd=repo)
    picks = [commit(repo, {"a.py": replace_line("a line 3\n", "a line 3 alpha\n")},
                    "cp: `feat: alpha (101)` into `core_r0.1.0` (#201)"),
             commit(repo, {"b.py": replace_line("b line 9\n", "b line 9 beta\n")}, "[dev] fix beta (cherry-pick #102) (#202)"),
             commit(repo, {"b.py": append("release_only = 1\n")}, "release only (#203)"),
             commit(repo, {"a.py": replace_line("a line 20\n", "a line 20 gamma\n")}, "gamma on the branch (#204)"),
             commit(repo, {"a.py": replace_line("a line 30\n", "a line 30 rel\n")}, "rel edits line 30 (#205)")]
    sh("git", "checkout", "-q", "main", cwd=repo)
    port = commit(repo, {"a.py": replace_line("a line 20\n", "a line 20 gamma\n")}, "Forward-port gamma (#204) (#105)")
    commit(repo, {"a.py": replace_line("a line 30\n", "a line 30 main\n")}, "main edits line 30 (#106)")
    return repo, b0, (alpha, beta, port), picks


def test_pick_key_links_picks_and_forward_ports_by_pr_number(tmp_path):
    repo, b0, (alpha, beta, port), picks = _repo(tmp_path)
    key = rc.pick_key(rc.read_commits(repo, f"{b0}..rel"), rc.read_commits(repo, f"{b0}..main"))
    assert key == {picks[0]: alpha, picks[1]: beta, picks[3]: port}


def test_replay_keeps_what_applies_and_says_what_was_there(tmp_path):
    repo, b0, _, picks = _repo(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    tip, made, there = rc.replay(repo, "main", rc.read_commits(repo, f"{b0}..rel"), work)
    assert there == {picks[0], picks[1], picks[3]}  # main has these changes already
    assert list(made) == [picks[2]]  # the line-30 edit conflicts with main's: left out
    assert sh("git", "log", "--format=%s", f"main..{tip}", cwd=repo).split("\n")[0] == "release only (#203)"
    assert "release_only = 1" in sh("git", "show", f"{tip}:b.py", cwd=repo)


def test_score_counts_pairs_and_absorption_against_the_key():
    data = {"mapping": [
        {"status": "modified", "old": [{"commit": "r1"}], "new": [{"commit": "n1"}]},
        {"status": "absorbed", "old": [{"commit": "r2"}], "new": [], "upstream_commit": "U2"},
        {"status": "absorbed", "old": [{"commit": "r3"}], "new": [], "upstream_commit": "U9"},
        {"status": "absorbed", "old": [{"commit": "r4"}], "new": []},
        {"status": "dropped", "old": [{"commit": "r5"}], "new": []},
    ]}
    back = {"r1": "o1", "r2": "o2", "r3": "o3", "r4": "o4", "r5": "o5", "n1": "o1"}
    s = rc.score(data, back, {"o1": "o1"}, {"o2": "U2", "o3": "U3", "o5": ""}, judged={"o1", "o2", "o3", "o5"})
    assert (s["pairs_found"], s["pairs"], s["paired_right"], s["paired"]) == (1, 1, 1, 1)
    assert (s["absorbed_right"], s["absorbed_said"], s["absorbed_found"], s["absorbed_key"]) == (2, 2, 2, 3)
    assert (s["named_right"], s["named"], s["unjudged"], s["unjudged_said"]) == (1, 2, 1, 1)


MIRROR = rc.mirror_path()


@pytest.mark.skipif(MIRROR is None or not (MIRROR / "objects").is_dir(),
                    reason=f"set {rc.MIRROR_ENV} to a bare clone of Megatron-LM")
def test_key_on_a_real_release_branch():
    tip, main_tip = rc.git(MIRROR, "rev-parse", "refs/heads/core_r0.19.0", "refs/heads/main").split()
    base = rc.git(MIRROR, "merge-base", main_tip, tip).strip()
    mine = rc.read_commits(MIRROR, f"{base}..{tip}")
    main = rc.read_commits(MIRROR, f"{base}..{main_tip}")
    key = rc.pick_key(mine, main)
    subjects = {sha: s for sha, s, _ in mine + main}
    assert len(key) >= 5
    for pick, orig in key.items():
        assert rc.own_pr(subjects[orig]) in rc.referenced_prs(subjects[pick]) or \
            rc.own_pr(subjects[pick]) in rc.referenced_prs(subjects[orig])


def _rows(*subjects):
    return [(f"c{k}", s, "") for k, s in enumerate(subjects)]


def test_reshape_regroups_drops_and_squashes_per_run():
    rows = _rows("router: fp32 logits", "ckpt: async save", "ckpt: async load", "docs: broken links",
                 "docs: typos", "tests: mark internal", "ci: retry flaky jobs")
    made = {sha: f"n{sha}" for sha, _, _ in rows}
    files = {sha: {f"{sha}.py"} for sha, _, _ in rows}
    units, shapes = rc.reshape(rows, made, files=files)
    # c0 with the first commit two places on sharing no subject word (c2); c1 stays between them
    assert shapes == {"regrouped": [("c0", "c2")], "dropped": ["c3"], "merged": [("c4", "c5")]}
    assert [[sha for sha, _, _ in commits] for commits, _ in units] == [["c0", "c2"], ["c1"], ["c4", "c5"], ["c6"]]
    assert units[0][1] == rc.REGROUP_MESSAGE and units[2][1] == "docs: typos\n\ntests: mark internal"
    # a commit a later one builds on (same file) is not dropped; one a commit between them touches
    # is not moved up into a regroup
    files["c6"] = {"c3.py"}
    assert rc.reshape(rows, made, files=files)[1]["dropped"] == ["c4"]
    files["c1"] = {"c2.py"}
    assert rc.reshape(rows, made, files=files)[1]["regrouped"] == [("c0", "c3")]
    # a run shorter than 4, or commits not eligible, are left as they are
    units, shapes = rc.reshape(rows, made, eligible={"c0", "c1", "c2"})
    assert shapes == {"regrouped": [], "dropped": [], "merged": []} and len(units) == len(rows)


def test_a_regroup_counts_only_with_a_commit_of_its_own_between():
    mine = _rows("a", "b", "c")
    shapes = {"regrouped": [("c0", "c2")], "dropped": [], "merged": []}
    assert rc.realized(shapes, {"c0": "X", "c2": "X", "c1": "Y"}, mine)["regrouped"] == [("c0", "c2")]
    assert rc.realized(shapes, {"c0": "X", "c2": "X"}, mine)["regrouped"] == []  # c1 did not replay
    assert rc.realized(shapes, {"c0": "X", "c2": "Z", "c1": "Y"}, mine)["regrouped"] == []  # not together


def test_score_reads_the_reshapes_by_status():
    data = {"mapping": [
        {"status": "regrouped", "old": [{"commit": "r0"}, {"commit": "r2"}], "new": [{"commit": "n0"}]},
        {"status": "likely-absorbed", "old": [{"commit": "r3"}], "new": []},
        {"status": "merged", "old": [{"commit": "r4"}], "new": [{"commit": "n4"}]},
        {"status": "merged", "old": [{"commit": "r5"}], "new": [{"commit": "n5"}]},
    ]}
    back = {f"r{k}": f"c{k}" for k in range(6)}
    shapes = {"regrouped": [("c0", "c2")], "dropped": ["c3"], "merged": [("c4", "c5")]}
    s = rc.score(data, back, {}, {}, judged={"c3"}, shapes=shapes)
    assert (s["regrouped_right"], s["regrouped_key"]) == (1, 1)
    assert (s["dropped_right"], s["dropped_key"]) == (0, 1)  # called likely absorbed: wrong
    assert (s["merged_right"], s["merged_key"]) == (0, 1)  # both merged, but on two rows
    assert (s["absorbed_said"], s["absorbed_right"]) == (1, 0)
