"""``seed --line NAME``: a line's series, patch files and pin become the release line's, and what only
the line says survives (its resolutions/, proof record, report, and the Tests: ids its patches add).

The defect it fixes: the upstream-main line was refreshed by copying the release line's files over
it, which dropped four Tests: ids the line had added for upstream main's own mHC layer."""

import pytest

from tests.tools.bumpkit import add_line, replace_line
from tools.rebase.cli import main
from tools.rebase.errors import RebaseError
from tools.rebase.stack.seed import add_test_ids, seed_line
from tools.rebase.stack.series import parse_patch, read_series
from tools.rebase.stack.workrepo import apply

ALPHA, BETA = "megatron/core/alpha.py", "megatron/core/beta.py"
BLOB = "ab" * 20  # a recorded resolution's file name
OK, LINE_ONLY = "tests/test_dummy.py::test_ok", "tests/test_dummy.py::test_only_on_the_line"


def release_and_stale_line(fork):
    """Release: alpha-seven then beta-eight. The line: an older alpha-seven naming one more test,
    its own resolutions/, proof record and report."""
    (fork.root / "tests" / "test_dummy.py").write_text(
        "def test_ok():\n    assert True\n\n\ndef test_only_on_the_line():\n    assert True\n")
    fork.stack([("alpha-seven", {ALPHA: replace_line("return 7\n", "return 70\n")}),
                ("beta-eight", {BETA: replace_line("BETA_8 = 8\n", "BETA_8 = 80\n")})])
    line = add_line(fork, "next")
    line.stack([("alpha-seven", {ALPHA: replace_line("return 7\n", "return 71\n")}, None, "Why it exists.",
                 f"{OK}\n {LINE_ONLY}")])
    (line.layout.resolutions / "alpha-seven").mkdir(parents=True)
    (line.layout.resolutions / "alpha-seven" / BLOB).write_text("recorded\n")
    (line.layout.patches / "proof.json").write_text("{}\n")
    line.layout.report_md.write_text("the line's report\n")
    return line


def line_files(line):
    home = line.layout.home
    return {p.relative_to(home).as_posix(): p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file()}


def test_seed_takes_the_release_stack_and_keeps_what_only_the_line_says(fork):
    line = release_and_stale_line(fork)
    before = line_files(line)
    seeded = seed_line(line.layout, log=lambda *_: None)
    assert seeded.patches == 2 and seeded.kept_tests == {"alpha-seven": [LINE_ONLY]}
    lay = line.layout
    assert lay.pin.read_bytes() == fork.layout.pin.read_bytes()
    assert read_series(lay.series).names == read_series(fork.layout.series).names
    alpha = parse_patch(lay.patches / "0001-alpha-seven.patch")
    assert alpha.tests == [OK, LINE_ONLY]
    assert "return 70" in (lay.patches / "0001-alpha-seven.patch").read_text()  # the release's diff
    beta = lay.patches / "0002-beta-eight.patch"
    assert beta.read_bytes() == (fork.layout.patches / "0002-beta-eight.patch").read_bytes()
    after = line_files(line)
    for kept in ("patches/resolutions/alpha-seven/" + BLOB, "patches/proof.json", "REBASE_REPORT.md"):
        assert after[kept] == before[kept]
    # what it replaced is saved, and the seeded stack builds
    assert (seeded.backup / "0001-alpha-seven.patch").read_bytes() == before["patches/0001-alpha-seven.patch"]
    apply(lay, log=lambda *_: None)
    assert "return 70" in (fork.root / ALPHA).read_text()


def test_seed_refuses_a_line_with_patches_the_release_line_lacks(fork):
    fork.stack([("alpha-seven", {ALPHA: replace_line("return 7\n", "return 70\n")})])
    line = add_line(fork, "next")
    line.stack([("beta-extra", {BETA: lambda t: t + "BETA_EXTRA = 'x'\n"})])
    before = line_files(line)
    with pytest.raises(RebaseError, match=r"line 'next' has patches the release line lacks: beta-extra"):
        seed_line(line.layout)
    assert line_files(line) == before


def test_seed_refuses_hand_edits_and_unexported_work_of_the_line(fork):
    line = release_and_stale_line(fork)
    patch = line.layout.patches / "0001-alpha-seven.patch"
    patch.write_text(patch.read_text().replace("Why it exists.", "Why it exists, edited."))
    before = line_files(line)
    with pytest.raises(RebaseError, match=r"changed since the line's last apply or export: 0001-alpha-seven.patch"):
        seed_line(line.layout)
    assert line_files(line) == before


def test_seed_needs_a_line_and_never_follows_a_link(fork, tmp_path):
    line = release_and_stale_line(fork)
    with pytest.raises(RebaseError, match="pass --line NAME"):
        seed_line(fork.layout)
    outside = tmp_path / "outside.patch"
    outside.write_text("not to be touched\n")
    patch = line.layout.patches / "0001-alpha-seven.patch"
    patch.unlink()
    patch.symlink_to(outside)
    with pytest.raises(RebaseError, match="must not be a symlink"):
        seed_line(line.layout)
    assert outside.read_text() == "not to be touched\n" and patch.is_symlink()


def test_a_failed_write_puts_the_line_back(fork, monkeypatch):
    line = release_and_stale_line(fork)
    before = line_files(line)
    from tools.rebase.stack import seed

    real = seed.write_file

    def fail_on_the_pin(root, path, data, *args):
        if path == line.layout.pin:
            raise OSError(28, "No space left on device")
        return real(root, path, data, *args)

    monkeypatch.setattr(seed, "write_file", fail_on_the_pin)
    with pytest.raises(OSError):
        seed_line(line.layout)
    assert line_files(line) == before


def test_the_cli_seeds_a_line(fork, capsys):
    line = release_and_stale_line(fork)
    assert main(["-C", str(fork.root), "seed", "--line", "next"]) == 0
    out = capsys.readouterr().out
    assert "seeded line 'next' from the release line: 2 patches" in out
    assert "kept its own Tests: ids: alpha-seven (1)" in out
    old_pin = fork.layout.pin.read_text()  # the line's base was a copy of the release line's
    commit = old_pin.split('commit = "')[1].split('"')[0]
    assert f"bump --line next --onto git:{fork.upstream}@{commit}" in out
    assert parse_patch(line.layout.patches / "0001-alpha-seven.patch").tests == [OK, LINE_ONLY]


def test_add_test_ids_appends_to_the_folded_trailer_and_refuses_a_patch_without_one():
    text = "From x\nSubject: s\n\nbody\n\nPatch-Name: a\nTests: t1\n t2\n\ndiff --git a/f b/f\n"
    assert add_test_ids(text, ["t3"], "p").split("diff")[0].endswith("Tests: t1\n t2\n t3\n\n")
    with pytest.raises(RebaseError, match="p: no 'Tests:' trailer"):
        add_test_ids("From x\nSubject: s\n\nbody\n\ndiff --git a/f b/f\n", ["t3"], "p")


def test_a_linked_backup_folder_is_replaced_not_written_through(fork, tmp_path):
    line = release_and_stale_line(fork)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine\n")
    backup = line.layout.state_dir / "seed-backup"
    backup.parent.mkdir(parents=True, exist_ok=True)
    backup.symlink_to(outside, target_is_directory=True)
    seeded = seed_line(line.layout, log=lambda *_: None)
    assert seeded.backup == backup and backup.is_dir() and not backup.is_symlink()
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert (backup / "upstream.toml").is_file()
