"""Recorded edits of a cleanly merged file apply in a chain.

The defect: at the upstream-dev line's stop on mhc-mtp-multistream, the merged file first got
the edit the upstream-main line had recorded (lent with ``--resolutions-from``), then the
maintainer rewrote it; that rewrite was recorded keyed by the lent edit's result. The refresh's
replay applied only the first edit and shipped the upstream-main version of the file."""

import subprocess

from tools.rebase.bump import merge_edits as rr


def git(cwd, *args, data=None):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          input=data).stdout.decode().strip()


def blob(work, text):
    return git(work, "hash-object", "-w", "--stdin", data=text.encode())


def record(work, before, after):
    """A recorded edit of the merged blob ``before`` under the patch's folder, naming f.py."""
    entry = work.parent / "resolutions" / "patch" / blob(work, before)
    entry.mkdir(parents=True)
    (entry / "preimage").write_text(before)
    (entry / "postimage").write_text(after)
    (entry / "path").write_text("f.py\n")
    return entry.name, entry


def test_an_edit_recorded_on_top_of_another_is_applied_after_it(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q")
    (work / "f.py").write_text("merged\n")
    git(work, "add", "f.py")
    edits = dict([record(work, "merged\n", "lent edit\n"), record(work, "lent edit\n", "line's rewrite\n")])
    assert rr.apply_merge_edits_chained(work, edits, {"f.py"}) == ["f.py"]
    assert (work / "f.py").read_text() == "line's rewrite\n"
    assert git(work, "diff", "--cached", "--name-only") == "f.py"


def test_edits_that_lead_back_to_their_start_stop(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q")
    (work / "f.py").write_text("a\n")
    git(work, "add", "f.py")
    edits = dict([record(work, "a\n", "b\n"), record(work, "b\n", "a\n")])
    assert rr.apply_merge_edits_chained(work, edits, {"f.py"}, rounds=3) == ["f.py"]
    assert (work / "f.py").read_text() == "b\n"  # a -> b -> a -> b, then the bound
