"""Lines: a second stack in ``lines/<name>/`` next to the release line, with its own pin, patches,
work repo and state; its name validated like every other name; and the base-less ``check``."""

import os

import pytest

from tests.tools.bumpkit import add_line, quiet, replace_line, sh
from tools.rebase.cli import main
from tools.rebase.errors import RebaseError
from tools.rebase.git.paths import Layout, layout
from tools.rebase.proof.check import BASELESS_NOTE, check
from tools.rebase.proof.listing import BEGIN, END
from tools.rebase.stack.workrepo import apply, export

ALPHA, BETA = "megatron/core/alpha.py", "megatron/core/beta.py"


def release_and_line(fork):
    """The release line with one patch, and line ``next`` on the same base with another."""
    fork.stack([("alpha-seven", {ALPHA: replace_line("return 7\n", "return 70\n")})])
    line = add_line(fork, "next")
    line.stack([("beta-extra", {BETA: lambda t: t + "BETA_EXTRA = 'x'\n"})])
    return line


def test_release_line_paths_are_the_top_level_ones(tmp_path):
    lay = Layout(tmp_path)
    assert (lay.pin, lay.series, lay.resolutions) == (
        tmp_path / "upstream.toml", tmp_path / "patches" / "series", tmp_path / "patches" / "resolutions")
    assert (lay.work, lay.state_file, lay.bump_journal) == (
        tmp_path / ".rebase" / "work", tmp_path / ".rebase" / "state.json",
        tmp_path / ".rebase" / "bump" / "journal.json")
    assert (lay.report_md, lay.readme, lay.line_flag) == (tmp_path / "REBASE_REPORT.md", tmp_path / "README.md", "")


def test_a_line_keeps_its_own_files_and_state(tmp_path):
    lay = Layout(tmp_path, "next")
    home = tmp_path / "lines" / "next"
    assert (lay.pin, lay.patches, lay.report_json) == (
        home / "upstream.toml", home / "patches", home / "REBASE_REPORT.json")
    assert (lay.work, lay.state_file, lay.bump_dir) == (
        tmp_path / ".rebase/lines/next/work", tmp_path / ".rebase/lines/next/state.json",
        tmp_path / ".rebase/lines/next/bump")
    # shared with the release line: the one megatron/ the tests import, the cache and the lock
    release = Layout(tmp_path)
    assert (lay.package, lay.lock_file) == (release.package, release.lock_file)


def test_apply_export_check_on_a_line_leave_the_release_line_alone(fork):
    fork.stack([("alpha-seven", {ALPHA: replace_line("return 7\n", "return 70\n")})])
    release_patches = fork.patch_files()
    release_state = fork.layout.state_file.read_bytes()
    release_head = sh("git", "rev-parse", "HEAD", cwd=fork.work)
    line = add_line(fork, "next")
    line.stack([("beta-extra", {BETA: lambda t: t + "BETA_EXTRA = 'x'\n"})])
    assert list(line.patch_files()) == ["0001-beta-extra.patch", "series"]
    assert (fork.root / "lines/next/patches/0001-beta-extra.patch").is_file()
    assert fork.patch_files() == release_patches
    assert fork.layout.state_file.read_bytes() == release_state
    assert sh("git", "rev-parse", "HEAD", cwd=fork.work) == release_head
    assert line.work != fork.work and (line.work / ".git").is_dir()
    # megatron/ holds the line applied last; each line checks green and re-applies on its own
    assert "BETA_EXTRA" in (fork.root / BETA).read_text()
    assert "return 70" not in (fork.root / ALPHA).read_text()
    assert check(line.layout, log=quiet) == []
    assert check(fork.layout, log=quiet) == []
    apply(fork.layout, log=quiet)
    assert "return 70" in (fork.root / ALPHA).read_text()
    assert "BETA_EXTRA" not in (fork.root / BETA).read_text()


def test_cli_line_flag_acts_on_the_line(fork, capsys):
    line = release_and_line(fork)
    (line.layout.patches / "0001-beta-extra.patch").write_text(
        (line.layout.patches / "0001-beta-extra.patch").read_text().replace("Tests: ", "Tests-x: "))
    assert main(["-C", str(fork.root), "check", "--line", "next"]) == 1
    err = capsys.readouterr().err
    assert "lines/next/patches/0001-beta-extra.patch: missing 'Tests:' trailer" in err
    assert main(["-C", str(fork.root), "check"]) == 0  # the release line is untouched
    assert main(["-C", str(fork.root), "list", "--line", "next"]) == 0
    out = capsys.readouterr().out
    assert "`beta-extra`" in out and "`alpha-seven`" not in out


@pytest.mark.parametrize("name", ["../x", "a/b", "-x", ".", "..", "a..b", "x\ny", "a\\b", "", "Upper"])
def test_bad_line_names_are_refused_before_any_path_is_built(fork, name, capsys):
    with pytest.raises(RebaseError, match="--line"):
        layout(fork.root, name)
    assert main(["-C", str(fork.root), "check", f"--line={name}"]) == 2
    assert "error: --line" in capsys.readouterr().err
    assert not (fork.root / ".rebase").exists()


def test_a_line_that_is_missing_or_a_symlink_is_refused(fork, tmp_path):
    with pytest.raises(RebaseError, match="no folder lines/next/"):
        layout(fork.root, "next")
    outside = tmp_path / "outside"
    (outside / "patches").mkdir(parents=True)
    (outside / "patches" / "series").write_text("")
    (outside / "upstream.toml").write_text(fork.layout.pin.read_text())
    (fork.root / "lines").mkdir()
    os.symlink(outside, fork.root / "lines" / "next")
    with pytest.raises(RebaseError, match="lines/next must be a real folder, not a symlink"):
        layout(fork.root, "next")
    (fork.root / "lines" / "next").unlink()
    (fork.root / "lines").rmdir()
    os.symlink(tmp_path, fork.root / "lines")  # tmp_path/next would be the line, outside the checkout
    (tmp_path / "next").symlink_to(outside)
    with pytest.raises(RebaseError, match="must be a real folder"):
        layout(fork.root, "next")


def test_a_committed_symlink_in_the_line_state_is_refused(fork, tmp_path):
    add_line(fork, "next")
    (fork.root / ".rebase").mkdir()
    os.symlink(tmp_path, fork.root / ".rebase" / "lines")
    with pytest.raises(RebaseError, match=r"\.rebase/lines must not be symlinks"):
        layout(fork.root, "next")


# ---------------------------------------------------------------- check --no-base

def unreachable_line(fork):
    """Line ``ahead`` pinned to a commit no repository here has (CI cannot fetch upstream main)."""
    pin = ('[upstream]\nkind = "git"\nurl = "https://example.invalid/upstream.git"\n'
           f'commit = "{"ab" * 20}"\nref = "main"\n')
    line = add_line(fork, "ahead", pin_text=pin)
    line.layout.series.write_text((fork.layout.series.read_text()))
    for patch in fork.layout.patches.glob("*.patch"):
        (line.layout.patches / patch.name).write_bytes(patch.read_bytes())
    return line


def test_baseless_check_lints_without_the_base_and_says_so(fork, capsys):
    fork.stack([("alpha-seven", {ALPHA: replace_line("return 7\n", "return 70\n")})])
    line = unreachable_line(fork)
    assert main(["-C", str(fork.root), "check", "--line", "ahead", "--no-base"]) == 0
    out = capsys.readouterr().out
    assert BASELESS_NOTE in out and "series ok: 1 patches" in out and "check: ok" in out
    assert "applies to the base" not in out
    assert not (line.work / ".git").exists()  # nothing was imported or built
    assert main(["-C", str(fork.root), "check", "--line", "ahead"]) == 1  # the full check needs the base
    assert "upstream pin:" in capsys.readouterr().err


def test_baseless_check_finds_series_trailer_and_resolution_problems(fork):
    fork.stack([("alpha-seven", {ALPHA: replace_line("return 7\n", "return 70\n")})])
    line = unreachable_line(fork)
    store = line.layout.resolutions
    good = store / "alpha-seven" / ("1" * 40)
    good.mkdir(parents=True)
    (good / "preimage").write_text("<<<<<<<\npre\n=======\nother\n>>>>>>>\n")  # a rerere conflict
    (good / "postimage").write_text("post\n")
    lines = []
    assert check_baseless(line, lines) == []
    assert lines[-1] == BASELESS_NOTE
    (good / "postimage").unlink()
    (store / "alpha-seven" / "not-an-id").mkdir()
    (store / "gone-patch" / ("2" * 40)).mkdir(parents=True)
    (line.layout.patches / "0002-stray.patch").write_text("x")
    problems = check_baseless(line, [])
    assert "lines/ahead/patches/0002-stray.patch: not listed in lines/ahead/patches/series" in problems
    assert f"lines/ahead/patches/resolutions/alpha-seven/{'1' * 40}: no postimage file " \
           f"(a resolution needs both images)" in problems
    assert "lines/ahead/patches/resolutions/alpha-seven/not-an-id: 'not-an-id' is not a 40-hex rerere id" in problems
    assert "lines/ahead/patches/resolutions/gone-patch: no patch of the series is named 'gone-patch'" in problems


def check_baseless(line, lines):
    from tools.rebase.proof.check import check_without_base

    return check_without_base(line.layout, log=lines.append)


def test_export_of_a_line_needs_its_line_flag_to_find_its_work(fork):
    """The release line's export never picks up a line's work-repo commits (separate work repos)."""
    line = release_and_line(fork)
    before = fork.patch_files()
    export(fork.layout, log=quiet)
    assert fork.patch_files() == before
    assert "0001-beta-extra.patch" in line.patch_files()


def test_readme_table_of_a_line_is_its_own_and_optional(fork, capsys):
    line = release_and_line(fork)
    readme = fork.root / "README.md"
    readme.write_text(f"top\n{BEGIN}\n{END}\n")
    before = readme.read_bytes()
    assert main(["-C", str(fork.root), "list", "--line", "next", "--update-readme"]) == 0
    assert readme.read_bytes() == before  # the release line's README is not the line's
    assert not line.layout.readme.exists()
    line.layout.readme.write_text(f"line\n{BEGIN}\n{END}\n")
    assert main(["-C", str(fork.root), "list", "--line", "next", "--update-readme"]) == 0
    assert "`beta-extra`" in line.layout.readme.read_text() and readme.read_bytes() == before
