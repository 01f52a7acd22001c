"""Where a vanished patch went upstream (issue 26, items 4, 5 and 6): into a file the stacks never
touched, re-implemented in other words ("likely absorbed"), and named by the commit whose text
survives (not a commit upstream reverted, nor one that only re-wrapped a line)."""

from tests.tools.bumpkit import append, branch_of_patches, commit, init, numbered, replace_line, sh
from tools.rebase.report.report import build_report

ALGO = "".join(f"    weight_{i} = scale_tokens(batch, {i}) + offset_{i}\n" for i in range(12))


def _setup(tmp_path, patches):
    repo = tmp_path / "repo"
    b0 = init(repo, {f"{t}.py": numbered(t) for t in "fgh"} | {"wrap.py": "call_it(first_arg,\n        second_arg)\n"},
              "upstream 1.0")
    old_tip = branch_of_patches(repo, b0, patches, "old")
    sh("git", "checkout", "-q", "main", cwd=repo)
    return repo, b0, old_tip


def _finish(repo, b0, old_tip, keep):
    b1 = sh("git", "rev-parse", "main", cwd=repo).strip()
    new_tip = branch_of_patches(repo, b1, keep, "new")
    data = build_report(repo, b0, old_tip, b1, new_tip)
    return {r["old"][0]["subject"]: r for r in data["mapping"] if r["old"]}


def test_absorbed_into_a_new_upstream_file(tmp_path):
    keep = ({"g.py": append("g_fork_only = 1\n")}, "keep g")
    repo, b0, old_tip = _setup(tmp_path, [({"f.py": append("def scaled():\n" + ALGO)}, "scaled weights"), keep])
    commit(repo, {"f.py": replace_line("f line 2\n", "f line 2 upstream\n")}, "upstream: touch f")
    moved = commit(repo, {"ops/scaling.py": "def scaled_weights(batch):\n" + ALGO}, "upstream: scaling ops module")
    rows = _finish(repo, b0, old_tip, [keep])
    row = rows["scaled weights"]
    assert row["status"] == "absorbed" and row["upstream_commit"] == moved
    assert "12/13 added lines, moved into `ops/scaling.py`" in row["note"]


def test_reimplementation_is_likely_absorbed_and_no_trace_is_dropped(tmp_path):
    ours = ("rollout_replay_cache_size: int = 0\n"
            "def build_replay_cache(config):\n    return [None] * config.rollout_replay_cache_size\n")
    repo, b0, old_tip = _setup(tmp_path, [
        ({"f.py": append(ours)}, "[2/5] feat: rollout replay cache"),
        ({"h.py": append("nobody_else_has_this = True\n")}, "[3/5] fork-only flag"),
    ])
    commit(repo, {"g.py": append("unrelated_upstream = 2\n")}, "upstream: unrelated")
    theirs = commit(repo, {"replay/cache.py": (
        "class ReplayCacheConfig:\n    rollout_replay_cache_size: int = 128  # entries kept\n\n"
        "def build_replay_cache(cfg: ReplayCacheConfig) -> list:\n"
        "    return list(range(cfg.rollout_replay_cache_size))\n")}, "Add a rollout replay cache (#4321)")
    rows = _finish(repo, b0, old_tip, [])
    row = rows["[2/5] feat: rollout replay cache"]
    assert row["status"] == "likely-absorbed" and row["upstream_commit"] == theirs
    assert row["note"].startswith(f"likely absorbed by {theirs[:12]} (Add a rollout replay cache (#4321)): "
                                  "same identifiers `rollout_replay_cache_size`, `build_replay_cache` (2 of the 2")
    assert "its subject shares cache, replay, rollout" in row["note"]
    assert rows["[3/5] fork-only flag"]["status"] == "dropped"


def test_revert_then_reapply_names_the_reapply(tmp_path):
    block = "".join(f"fork_knob_{i} = {i} * 7\n" for i in range(6))
    repo, b0, old_tip = _setup(tmp_path, [({"f.py": replace_line("f line 9\n", "f line 9\n" + block)}, "knobs")])
    first = commit(repo, {"f.py": replace_line("f line 9\n", "f line 9\n" + block)}, "upstream: knobs")
    revert = commit(repo, {"f.py": replace_line(block, "")}, 'Revert "upstream: knobs"')
    again = commit(repo, {"f.py": replace_line("f line 9\n", "f line 9\n" + block)}, 'Reapply "upstream: knobs"')
    row = _finish(repo, b0, old_tip, [])["knobs"]
    assert row["status"] == "absorbed" and row["upstream_commit"] == again
    assert first != again and revert not in row["note"]


def test_a_commit_that_only_rewrapped_the_line_is_not_an_absorber(tmp_path):
    repo, b0, old_tip = _setup(tmp_path, [
        ({"f.py": replace_line("f line 5\n", "f line 5\ncall_it(first_arg, second_arg)\n"),
          "wrap.py": append("# the fork calls it from f.py too\n")}, "call it in f")])
    commit(repo, {"wrap.py": "call_it(first_arg, second_arg)\n"}, "upstream: re-wrap a call")
    row = _finish(repo, b0, old_tip, [])["call it in f"]
    assert row["status"] == "dropped", row
