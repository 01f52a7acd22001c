"""Post-merge lint (issue 15, item 5): a clean 3-way merge that defines a dataclass field twice
stops the bump like a conflict; pre-existing upstream duplicates and property setters do not."""

import pytest

from tests.tools.bumpkit import make_fork, quiet, replace_line, sh
from tools.rebase.bump import journal
from tools.rebase.bump.bump import Stopped, bump, bump_continue
from tools.rebase.analysis.lint import lint_source

CFG = "megatron/core/config.py"
FIELDS = "".join(f"    field_{i}: int = {i}\n" for i in range(30))
FILES = {
    "megatron/core/package_info.py": "MAJOR = 0\nMINOR = 42\nPATCH = 1\n__version__ = '0.42.1'\n",
    "megatron/core/__init__.py": "",
    CFG: "from dataclasses import dataclass\n\n\n@dataclass\nclass Config:\n" + FIELDS,
    "megatron/core/notes.txt": "note 1\nnote 2\nnote 3\n",
}


@pytest.fixture
def fork(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    return make_fork(tmp_path, files=FILES)


def no_runner(layout, name, ids):
    return {i: "passed" for i in ids}


def test_lint_source_finds_duplicates_and_syntax_but_not_accessors():
    text = ("class A:\n    x: int = 1\n    def f(self):\n        pass\n    x: int = 2\n"
            "    @property\n    def p(self):\n        return 1\n    @p.setter\n    def p(self, v):\n        pass\n"
            "def g():\n    pass\ndef g():\n    pass\n")
    found = {(f.scope, f.name, f.line) for f in lint_source("m.py", text)}
    assert found == {("class A", "x", 5), ("module", "g", 14)}
    bad = lint_source("m.py", "def broken(:\n")
    assert len(bad) == 1 and bad[0].what == "syntax" and "does not compile" in str(bad[0])


def test_clean_merge_with_duplicate_field_stops_then_continues(fork):
    fork.stack([("mhc-iters", {CFG: replace_line("    field_2: int = 2\n",
                                                 "    field_2: int = 2\n    mhc_iters: int = 20\n")})])
    # Upstream adds the same field far away: git merges both without a conflict.
    fork.upstream_commit({CFG: replace_line("    field_27: int = 27\n",
                                            "    field_27: int = 27\n    mhc_iters: int = 20\n")},
                         "upstream: own mhc_iters", tag="v2")
    with pytest.raises(Stopped) as stop:
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=no_runner)
    text = str(stop.value)
    assert "0001-mhc-iters merged without a conflict" in text
    assert "'mhc_iters' is defined twice in class Config" in text
    j = journal.load(fork.layout)
    assert j.phase == "stopped" and j.stopped.kind == "lint"
    assert j.stopped.files == [CFG]
    # The merged result is staged on the new base, ready to be fixed.
    staged = sh("git", "diff", "--cached", "--name-only", cwd=fork.work).split()
    assert staged == [CFG]
    assert (fork.work / CFG).read_text().count("mhc_iters: int = 20") == 2
    # Continuing without a fix is refused; removing our copy lets it finish.
    with pytest.raises(Stopped, match="defined twice"):
        bump_continue(fork.layout, log=quiet, test_runner=no_runner)
    (fork.work / CFG).write_text((fork.work / CFG).read_text().replace(
        "    field_2: int = 2\n    mhc_iters: int = 20\n", "    field_2: int = 2\n", 1))
    sh("git", "add", CFG, cwd=fork.work)
    data = bump_continue(fork.layout, log=quiet, test_runner=no_runner)
    assert data["counts"]["absorbed"] == 1  # the fix left nothing of the patch: upstream has it
    assert not journal.journal_path(fork.layout).exists()


def test_duplicates_already_in_upstream_do_not_stop(fork):
    fork.stack([("touch-config", {CFG: replace_line("    field_2: int = 2\n", "    field_2: int = 22\n")})])
    fork.upstream_commit({CFG: replace_line("    field_27: int = 27\n",
                                            "    field_27: int = 27\n    field_28: int = 99\n")},
                         "upstream: its own duplicate", tag="v2")
    data = bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=no_runner)
    assert data["mapping"][0]["status"] in ("refreshed", "identical")


def test_conflict_stop_also_lints_the_files_that_merged_cleanly(fork):
    fork.stack([("both", {CFG: replace_line("    field_2: int = 2\n", "    field_2: int = 2\n    dup: int = 1\n"),
                          "megatron/core/notes.txt": replace_line("note 2\n", "note 2 fork\n")})])
    fork.upstream_commit({CFG: replace_line("    field_27: int = 27\n", "    field_27: int = 27\n    dup: int = 1\n"),
                          "megatron/core/notes.txt": replace_line("note 2\n", "note 2 upstream\n")},
                         "upstream: both", tag="v2")
    with pytest.raises(Stopped) as stop:
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=no_runner)
    text = str(stop.value)
    assert "megatron/core/notes.txt (content conflict)" in text
    assert "files that merged cleanly but break the post-merge lint:" in text
    assert "'dup' is defined twice in class Config" in text
