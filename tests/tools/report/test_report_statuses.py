"""``report`` on plain git ranges: every status, pairing beyond range-diff, determinism, CLI."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools.bumpkit import append, commit, init, numbered, patch_msg, replace_line, sh
from tools.rebase.analysis.classify import STATUSES
from tools.rebase.errors import RebaseError
from tools.rebase.report.report import build_report, write_report

REPO_ROOT = Path(__file__).resolve().parents[3]

BLOCK_X = "".join(f"x_value_{i} = {i} * 3\n" for i in range(6))
BLOCK_Y = "".join(f"y_value_{i} = {i} * 5\n" for i in range(6))
BLOCK_Z1 = "".join(f"z_first_{i} = 'a{i}'\n" for i in range(6))
BLOCK_Z2 = "".join(f"z_second_{i} = 'b{i}'\n" for i in range(6))


def _files():
    return {f"{t}.py": numbered(t) for t in ("a", "b", "c", "d", "e", "f", "g", "h", "k", "m")}


def make_stacks(repo: Path):
    """Old stack on B0, upstream moves to B1 (absorbs one patch, drifts context), new stack on B1."""
    b0 = init(repo, _files(), "upstream 1.0")
    old = [
        ({"d.py": replace_line("d line 5\n", "d line 5 fork\n")}, patch_msg("ident")),
        ({"a.py": replace_line("a line 10\n", "a line 10 fork\n")}, patch_msg("refresh")),
        ({"b.py": replace_line("b line 5\n", "b line 5 fork v1\n")}, patch_msg("mod")),
        ({"c.py": replace_line("c line 3\n", "c line 3 fork\n")}, patch_msg("msg", body="Old words.")),
        ({"c.py": replace_line("c line 30\n", "c line 30 upstream wants this\n")}, patch_msg("absorbed-one")),
        ({"e.py": replace_line("e line 7\n", "e line 7 no longer needed\n")}, patch_msg("gone")),
        ({"h.py": replace_line("h line 2\n", "h line 2 fork\n")}, patch_msg("renum")),
        ({"f.py": append(BLOCK_X)}, patch_msg("m-one")),
        ({"f.py": replace_line("f line 3\n", "f line 3\n" + BLOCK_Y)}, patch_msg("m-two")),
        ({"g.py": append(BLOCK_Z1 + BLOCK_Z2)}, patch_msg("splitme")),
        ({"k.py": replace_line("k line 4\n", "k line 4 first\n")}, patch_msg("r-one")),
        ({"m.py": replace_line("m line 4\n", "m line 4 second\n")}, patch_msg("r-two")),
    ]
    sh("git", "checkout", "-q", "-b", "old", b0, cwd=repo)
    for edits, msg in old:
        commit(repo, edits, msg)
    old_tip = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    sh("git", "checkout", "-q", "main", cwd=repo)
    commit(repo, {"a.py": replace_line("a line 11\n", "a line 11 upstream\n")}, "upstream: touch a.py")
    absorbing = commit(repo, {"c.py": replace_line("c line 30\n", "c line 30 upstream wants this\n"),
                              "k.py": replace_line("k line 30\n", "k line 30 other\n")},
                       "upstream: take the fork's c.py change")
    b1 = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    new = [
        ({"d.py": replace_line("d line 5\n", "d line 5 fork\n")}, patch_msg("ident")),
        ({"a.py": replace_line("a line 10\n", "a line 10 fork\n")}, patch_msg("refresh")),
        ({"b.py": replace_line("b line 5\n", "b line 5 fork v2\n")}, patch_msg("mod")),
        ({"c.py": replace_line("c line 3\n", "c line 3 fork\n")}, patch_msg("msg", body="New words.")),
        ({"h.py": replace_line("h line 2\n", "h line 2 fork\n")}, patch_msg("renum")),
        ({"f.py": lambda t: t.replace("f line 3\n", "f line 3\n" + BLOCK_Y) + BLOCK_X}, patch_msg("m-one")),
        ({"g.py": append(BLOCK_Z1)}, patch_msg("splitme")),
        ({"g.py": append(BLOCK_Z2)}, patch_msg("splitme-second")),
        ({"m.py": replace_line("m line 4\n", "m line 4 second\n")}, patch_msg("r-two")),
        ({"k.py": replace_line("k line 4\n", "k line 4 first\n")}, patch_msg("r-one")),
        ({"b.py": replace_line("b line 20\n", "b line 20 brand new\n")}, patch_msg("fresh")),
    ]
    sh("git", "checkout", "-q", "-b", "new", b1, cwd=repo)
    for edits, msg in new:
        commit(repo, edits, msg)
    new_tip = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    return b0, old_tip, b1, new_tip, absorbing


def _by_first_subject(data):
    out = {}
    for row in data["mapping"]:
        key = (row["new"] or row["old"])[0]["subject"]
        out[key] = row
    return out


def test_every_status_on_plain_git_ranges(tmp_path):
    repo = tmp_path / "repo"
    b0, old_tip, b1, new_tip, absorbing = make_stacks(repo)
    data = build_report(repo, b0, old_tip, b1, new_tip)
    rows = _by_first_subject(data)
    expect = {
        "ident": "identical", "refresh": "refreshed", "mod": "modified", "msg": "message-only",
        "absorbed-one": "absorbed", "gone": "dropped", "renum": "renumbered", "m-one": "merged",
        "splitme": "split", "fresh": "new",
    }
    for subject, status in expect.items():
        assert rows[subject]["status"] == status, (subject, rows[subject])
    reordered = [r for r in data["mapping"] if r["status"] == "reordered"]
    assert len(reordered) == 1 and reordered[0]["new"][0]["subject"] in ("r-one", "r-two")
    # likely-absorbed (a re-implementation upstream), regrouped and unreached (a clean merge into code
    # the new base no longer reaches) have their own tests in test_report_upstream_search.py,
    # test_report_drops_and_regroups.py and test_report_unreached.py
    assert {s for s in STATUSES if data["counts"][s]} == set(STATUSES) - {"likely-absorbed", "regrouped", "unreached"}
    # merged: both old patches on one row, in old order; split: one old, two new
    assert [c["subject"] for c in rows["m-one"]["old"]] == ["m-one", "m-two"]
    assert [c["subject"] for c in rows["splitme"]["new"]] == ["splitme", "splitme-second"]
    # absorbed names the upstream commit; dropped does not pretend it was absorbed
    assert rows["absorbed-one"]["upstream_commit"] == absorbing
    assert "upstream_commit" not in rows["gone"] and rows["gone"]["new"] == []
    # modified carries a compact interdiff of the changed lines only
    inter = rows["mod"]["interdiff"]
    assert "-+b line 5 fork v1" in inter and "++b line 5 fork v2" in inter
    assert "b line 4" not in inter
    # upstream churn lists upstream commits touching stack files
    churn = data["upstream_churn"]
    assert churn["kind"] == "commits"
    assert [e["subject"] for e in churn["entries"]] == ["upstream: touch a.py", "upstream: take the fork's c.py change"]
    assert churn["entries"][1]["files"] == ["c.py", "k.py"]
    # JSON rows: {commit, subject} lists
    for row in data["mapping"]:
        for ref in row["old"] + row["new"]:
            assert set(ref) == {"commit", "subject"} and len(ref["commit"]) == 40


def test_range_diff_alone_calls_context_drift_modified(tmp_path):
    """The reason for our own classification: range-diff marks the refreshed patch '!'."""
    repo = tmp_path / "repo"
    b0, old_tip, b1, new_tip, _ = make_stacks(repo)
    out = sh("git", "range-diff", "--no-color", "--no-patch", f"{b0}..{old_tip}", f"{b1}..{new_tip}", cwd=repo)
    line = next(l for l in out.splitlines() if l.rstrip().endswith(" refresh"))
    assert " ! " in line
    data = build_report(repo, b0, old_tip, b1, new_tip)
    assert _by_first_subject(data)["refresh"]["status"] == "refreshed"


def test_pairing_without_patch_name_trailers(tmp_path):
    """A stack someone keeps as a plain branch (no trailers) still pairs by content and subject."""
    repo = tmp_path / "repo"
    b0 = init(repo, _files(), "base")
    sh("git", "checkout", "-q", "-b", "old", cwd=repo)
    commit(repo, {"a.py": replace_line("a line 10\n", "a line 10 x\n")}, "fix a")
    commit(repo, {"b.py": append(BLOCK_X)}, "feature x")
    commit(repo, {"b.py": replace_line("b line 2\n", "b line 2\n" + BLOCK_Y)}, "feature y")
    old_tip = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    sh("git", "checkout", "-q", "-b", "new", b0, cwd=repo)
    commit(repo, {"b.py": lambda t: t.replace("b line 2\n", "b line 2\n" + BLOCK_Y) + BLOCK_X}, "features x and y")
    commit(repo, {"a.py": replace_line("a line 10\n", "a line 10 x\n")}, "fix a (reworded subject)")
    new_tip = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    data = build_report(repo, "main", "old", "main", "new")
    statuses = sorted((r["status"], [c["subject"] for c in r["old"]]) for r in data["mapping"])
    assert ("merged", ["feature x", "feature y"]) in statuses
    fix = next(r for r in data["mapping"] if r["old"] and r["old"][0]["subject"] == "fix a")
    assert fix["new"][0]["subject"] == "fix a (reworded subject)"
    assert fix["status"] in ("message-only", "reordered")
    assert data["new"]["tip"] == new_tip and data["old"]["base"]["kind"] == "commit"


def test_report_is_byte_identical_and_cli_matches_library(tmp_path):
    repo = tmp_path / "repo"
    b0, old_tip, b1, new_tip, _ = make_stacks(repo)
    outs = []
    for k in range(2):
        md, js = tmp_path / f"r{k}.md", tmp_path / f"r{k}.json"
        proc = subprocess.run(
            [sys.executable, "-m", "tools.rebase", "report", "--repo", str(repo),
             "--old", f"{b0}..{old_tip}", "--new", f"{b1}..{new_tip}", "--output", str(md), "--json", str(js)],
            cwd=REPO_ROOT, capture_output=True, text=True,
        )
        assert proc.returncode == 0, proc.stderr
        outs.append((md.read_bytes(), js.read_bytes()))
    assert outs[0] == outs[1]
    data = json.loads(outs[0][1])
    lib = tmp_path / "lib.md"
    write_report(build_report(repo, b0, old_tip, b1, new_tip), lib)
    assert lib.read_bytes() == outs[0][0]
    md = outs[0][0].decode()
    assert "| 5 | — | `absorbed-one` | absorbed-one | absorbed |" in md
    assert md.count("\n| ") == len(data["mapping"]) + 1
    assert "## Upstream churn" in md and "```diff" in md


def test_bad_ranges_are_named(tmp_path):
    repo = tmp_path / "repo"
    make_stacks(repo)
    with pytest.raises(RebaseError, match="'nope' does not name a commit"):
        build_report(repo, "main", "nope", "main", "new")
    proc = subprocess.run(
        [sys.executable, "-m", "tools.rebase", "report", "--repo", str(repo), "--old", "main", "--new", "main..new",
         "--output", str(tmp_path / "x.md")], cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "--old" in proc.stderr and "BASE..TIP" in proc.stderr


def test_absorbed_without_history_and_inside_a_bigger_upstream_commit(tmp_path):
    """Unrelated bases (no history, like two sdists): an old patch whose change the new base already
    has is absorbed (its reverse applies), a patch nobody has is dropped. With history, a patch taken
    inside a bigger upstream commit (other hunks in the same file: different patch-id) is still named."""
    repo = tmp_path / "repo"
    files = _files()
    b0 = init(repo, files, "release 1")
    sh("git", "checkout", "-q", "-b", "old", cwd=repo)
    commit(repo, {"a.py": replace_line("a line 10\n", "a line 10 taken\n")}, patch_msg("taken"))
    commit(repo, {"b.py": replace_line("b line 10\n", "b line 10 ours only\n")}, patch_msg("ours-only"))
    old_tip = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    # release 2 as a parentless commit: no history between the bases
    sh("git", "checkout", "-q", "--orphan", "rel2", cwd=repo)
    rel2 = dict(files, **{"a.py": files["a.py"].replace("a line 10\n", "a line 10 taken\n")
                                    .replace("a line 30\n", "a line 30 elsewhere\n")})
    b1 = commit(repo, rel2, "release 2")
    sh("git", "checkout", "-q", "-b", "new", cwd=repo)
    commit(repo, {"c.py": replace_line("c line 1\n", "c line 1 x\n")}, patch_msg("unrelated"))
    new_tip = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    data = build_report(repo, b0, old_tip, b1, new_tip)
    rows = _by_first_subject(data)
    assert rows["taken"]["status"] == "absorbed" and "already in the new base" in rows["taken"]["note"]
    assert "upstream_commit" not in rows["taken"]
    assert rows["ours-only"]["status"] == "dropped"
    assert data["upstream_churn"]["kind"] == "files"
    (entry,) = data["upstream_churn"]["entries"]
    assert {k: entry[k] for k in ("file", "added", "removed")} == {"file": "a.py", "added": "2", "removed": "2"}
    assert entry["patches"] == []  # the only patch touching a.py was absorbed: none left in the new stack
    assert "+a line 10 taken" in entry["diff"] and "+a line 30 elsewhere" in entry["diff"]
    # Same, with history: upstream takes the change together with another hunk of the same file.
    sh("git", "checkout", "-q", "main", cwd=repo)
    big = commit(repo, {"a.py": lambda t: t.replace("a line 10\n", "a line 10 taken\n")
                        .replace("a line 30\n", "a line 30 elsewhere\n")}, "upstream: big change")
    sh("git", "checkout", "-q", "-b", "new2", cwd=repo)
    commit(repo, {"c.py": replace_line("c line 1\n", "c line 1 x\n")}, patch_msg("unrelated"))
    data = build_report(repo, b0, old_tip, "main", "new2")
    row = _by_first_subject(data)["taken"]
    assert row["status"] == "absorbed" and row["upstream_commit"] == big
    assert "2/2 changed lines" in row["note"]
