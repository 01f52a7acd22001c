"""``edit PATCH``: a change made at the top of the stack (in .rebase/work, or by hand in the
generated megatron/) is folded into a patch below the top, exported, and passes check; a change
to files the patch does not touch, or one a later patch no longer applies over, leaves everything
as it was."""

import pytest

from tests.tools.bumpkit import quiet
from tools.rebase.cli import main
from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import git, is_clean, rev_parse
from tools.rebase.proof.check import check
from tools.rebase.stack.edit import edit
from tools.rebase.stack.materialize import local_edits
from tools.rebase.stack.state import read_state
from tools.rebase.stack.workrepo import apply, export

ALPHA = "megatron/core/alpha.py"
BETA = "megatron/core/beta.py"


def three_patch_stack(fork):
    apply(fork.layout, log=quiet)
    fork.add_patch("alpha-seven", {ALPHA: lambda t: t.replace("return 7\n", "return 70\n")})
    fork.add_patch("beta-extra", {BETA: lambda t: t + "BETA_EXTRA = 'x'\n"})
    fork.add_patch("alpha-three", {ALPHA: lambda t: t.replace("return 3\n", "return 30\n")})
    export(fork.layout, log=quiet)


def edit_work(fork, rel, old, new):
    path = fork.work / rel
    path.write_text(path.read_text().replace(old, new))


def test_edit_folds_a_work_repo_change_into_a_middle_patch(fork):
    three_patch_stack(fork)
    before = fork.patch_files()
    edit_work(fork, BETA, "BETA_EXTRA = 'x'", "BETA_EXTRA = 'y'")
    assert edit(fork.layout, "beta-extra", log=quiet) == "0002-beta-extra.patch"
    after = fork.patch_files()
    assert "BETA_EXTRA = 'y'" in after["0002-beta-extra.patch"].decode()
    assert after["0001-alpha-seven.patch"] == before["0001-alpha-seven.patch"]
    assert after["0003-alpha-three.patch"] == before["0003-alpha-three.patch"]
    assert "BETA_EXTRA = 'y'" in (fork.root / BETA).read_text()  # megatron/ re-materialized
    assert is_clean(fork.work) and rev_parse(fork.work, "HEAD") == read_state(fork.layout)["tip"]
    assert git("rev-list", "--count", f"{read_state(fork.layout)['base']}..HEAD", cwd=fork.work).strip() == "3"
    assert check(fork.layout, log=quiet) == []


def test_edit_takes_a_hand_edit_of_megatron_into_the_patch_by_number(fork, capsys):
    three_patch_stack(fork)
    target = fork.root / ALPHA
    target.write_text(target.read_text().replace("return 70\n", "return 77\n"))
    assert local_edits(fork.layout.package) == ["core/alpha.py"]
    assert main(["-C", str(fork.root), "edit", "1", "--from-tree"]) == 0
    assert "folded 1 file(s) into 0001-alpha-seven.patch" in capsys.readouterr().out
    patches = fork.patch_files()
    assert "+    return 77" in patches["0001-alpha-seven.patch"].decode()
    assert "return 30" in patches["0003-alpha-three.patch"].decode()
    assert local_edits(fork.layout.package) == []  # megatron/ is the tool's again, edit included
    assert "return 77" in target.read_text() and "return 77" in (fork.work / ALPHA).read_text()
    assert check(fork.layout, log=quiet) == []


def test_edit_refuses_files_the_patch_does_not_touch_unless_told(fork):
    three_patch_stack(fork)
    edit_work(fork, ALPHA, "return 70\n", "return 71\n")
    files, work = fork.snapshot()
    with pytest.raises(RebaseError, match=r"touches 1 file\(s\) 0002-beta-extra.patch does not: "
                                          r"megatron/core/alpha.py.*--other-files.*Nothing was changed"):
        edit(fork.layout, "beta-extra", log=quiet)
    assert fork.snapshot() == (files, work)  # the edit is still uncommitted, unstaged
    assert edit(fork.layout, "beta-extra", other_files=True, log=quiet) == "0002-beta-extra.patch"
    assert "+    return 71" in fork.patch_files()["0002-beta-extra.patch"].decode()
    assert check(fork.layout, log=quiet) == []


def test_a_change_a_later_patch_does_not_apply_over_leaves_everything_as_it_was(fork):
    apply(fork.layout, log=quiet)
    fork.add_patch("alpha-seven", {ALPHA: lambda t: t.replace("return 7\n", "return 70\n")})
    fork.add_patch("alpha-seven-again", {ALPHA: lambda t: t.replace("return 70\n", "return 700\n")})
    export(fork.layout, log=quiet)
    edit_work(fork, ALPHA, "return 700\n", "return 7000\n")  # only exists on top of the second patch
    files, work = fork.snapshot()
    package = (fork.root / ALPHA).read_text()
    with pytest.raises(RebaseError, match="does not fold into 0001-alpha-seven.patch.*Nothing was changed"):
        edit(fork.layout, "alpha-seven", log=quiet)
    assert fork.snapshot() == (files, work)
    assert not (fork.work / ".git" / "rebase-merge").exists()
    assert (fork.root / ALPHA).read_text() == package
    # The same change belongs to the later patch: there it folds.
    assert edit(fork.layout, "alpha-seven-again", log=quiet) == "0002-alpha-seven-again.patch"
    assert check(fork.layout, log=quiet) == []


def test_edit_names_what_is_missing(fork):
    three_patch_stack(fork)
    with pytest.raises(RebaseError, match="nothing to fold into 0002-beta-extra.patch: .* has no uncommitted changes"):
        edit(fork.layout, "beta-extra", log=quiet)
    with pytest.raises(RebaseError, match="no patch in the series is named 'nope'"):
        edit(fork.layout, "nope", log=quiet)
    edit_work(fork, BETA, "BETA_EXTRA = 'x'", "BETA_EXTRA = 'z'")
    with pytest.raises(RebaseError, match="uncommitted changes too"):
        edit(fork.layout, "beta-extra", from_tree=True, log=quiet)
