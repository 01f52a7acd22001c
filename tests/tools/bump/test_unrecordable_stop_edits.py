"""A stop's resolution that adds a file the patch does not add is named, not silently lost.

The defect: at the upstream-dev line's stop on mhc-fused-kernels the resolution added
``fused_mhc_fork_kernels.py``. Recorded edits are keyed by the blob a file has before the edit,
and an added file has none, so nothing was recorded and the next refresh shipped the patch
without the file, with no word at the stop. ``bump --continue`` now warns, naming the file."""

import subprocess

from tools.rebase.bump import merge_edits as rr


def git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def commit(work, files, message):
    for path, text in files.items():
        if text is None:
            git(work, "rm", "-q", path)
        else:
            (work / path).write_text(text)
            git(work, "add", path)
    git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)
    return git(work, "rev-parse", "HEAD")


def test_added_files_and_deleted_merged_files_are_named(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q")
    parent = commit(work, {"base.py": "base\n", "other.py": "other\n"}, "upstream and earlier patches")
    # The patch merged new.py (added cleanly) and conflicted in base.py; the resolution edits
    # base.py and other.py, keeps new.py and adds extra.py.
    resolved = commit(
        work,
        {"base.py": "resolved\n", "other.py": "edited\n", "new.py": "new\n", "extra.py": "extra\n"},
        "the stop's resolution",
    )
    merged = {"new.py": "0" * 40}
    assert rr.unrecordable_stop_edits(work, parent, resolved, merged, ["base.py"]) == ["extra.py"]
    # other.py is recorded (keyed by its parent blob), so it is not named
    assert "other.py" in rr.edits_outside_the_merge(work, parent, resolved, set(merged) | {"base.py"})


def test_a_deleted_merged_file_is_named(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q")
    parent = commit(work, {"base.py": "base\n"}, "upstream")
    resolved = commit(work, {"base.py": "resolved\n"}, "the resolution, without the patch's gone.py")
    assert rr.unrecordable_stop_edits(work, parent, resolved, {"gone.py": "0" * 40}) == ["gone.py"]
    assert rr.unrecordable_stop_edits(work, parent, resolved, {}, ["base.py"]) == []
