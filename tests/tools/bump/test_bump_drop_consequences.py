"""Dropping a patch (issue 15, item 6): the drop names the later patches whose context came from
it and its orphaned Tests: files (in the log and the report), and a later conflict on that context
says it came from the dropped patch."""

import pytest

from tests.tools.bumpkit import make_fork, replace_line
from tools.rebase.bump.bump import Stopped, bump, bump_continue

B, D = "megatron/core/beta.py", "megatron/core/delta.py"


@pytest.fixture
def fork(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    return make_fork(tmp_path)


def test_drop_names_dependents_and_orphaned_tests(fork):
    fork.stack([
        ("base-feature", {B: replace_line("beta line 10\n", "beta line 10 fork\nfork helper\n")}),
        ("other", {D: replace_line("delta line 3\n", "delta line 3 fork\n")}),
        ("uses-feature", {B: replace_line("fork helper\n", "fork helper used\n")}),
    ])
    # base-feature's own test file is named by it alone; "other" shares the dummy test.
    fork.upstream_commit({B: replace_line("beta line 10\n", "beta line 10 upstream\n")}, "up: beta 10", tag="v2")
    from tools.rebase.stack.series import load_stack

    _, patches = load_stack(fork.layout)
    text = patches[0].path.read_text().replace("Tests: tests/test_dummy.py::test_ok",
                                               "Tests: tests/test_feature.py::test_it")
    patches[0].path.write_text(text)
    from tools.rebase.stack.workrepo import apply

    apply(fork.layout, log=lambda *_: None)
    with pytest.raises(Stopped, match="0001-base-feature"):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=lambda *_: None)
    logged = []
    with pytest.raises(Stopped) as second:
        bump_continue(fork.layout, drop=True, log=logged.append)
    assert any("later patches built on its lines: uses-feature" in line and "tests/test_feature.py" in line
               for line in logged), logged
    assert "0003-uses-feature" in str(second.value)
    assert "introduced by a patch dropped in this bump: base-feature" in str(second.value)
    data = bump_continue(fork.layout, drop=True, log=lambda *_: None, run_tests=False)
    rows = {r["patch_name"]: r for r in data["mapping"]}
    assert rows["base-feature"]["status"] == "dropped"
    assert "later patches built on its lines: uses-feature" in rows["base-feature"]["note"]
    assert "its Tests: files are now orphaned: tests/test_feature.py" in rows["base-feature"]["note"]
    assert "orphaned" not in rows["uses-feature"]["note"]  # its test file is still named by "other"
