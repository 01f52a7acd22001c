"""The line's premise and drops re-checked (issue 54, item 5): a line declares in premise.toml the
names its base must define, and the reasons in patches/dropped cite upstream commits and names;
a bump onto a base that breaks either is refused with the reason and nothing changed, unless
--allow-broken-premise; the dry run lists them as warnings. Checked statically (ast, git grep)."""

import pytest

from tests.tools.bumpkit import UPSTREAM_FILES, add_line, make_fork, quiet, replace_line, sh
from tools.rebase.bump import forecast
from tools.rebase.bump.bump import bump
from tools.rebase.errors import RebaseError
from tools.rebase.stack.premise import parse_premise

HYPER = "megatron/core/hyper.py"
HYPER_TEXT = ("import os\n\n\nclass HyperModule:\n    def __init__(self):\n        self.stream_count = 4\n\n\n"
              "class Config:\n    enable_hyper_streams: bool = False\n")
PREMISE = (f'[[symbol]]\npath = "{HYPER}"\nname = "HyperModule"\nwhy = "the base\'s mHC is the model"\n\n'
           f'[[symbol]]\npath = "{HYPER}"\nname = "Config.enable_hyper_streams"\n')


def runner(layout, name, ids):
    return {i: "passed" for i in ids}


@pytest.fixture
def line(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork = make_fork(tmp_path, files={**UPSTREAM_FILES, HYPER: HYPER_TEXT})
    dev = add_line(fork, "dev")
    dev.stack([("keep-alpha", {"megatron/core/alpha.py": replace_line("alpha line 10\n", "alpha line 10 fork\n")})])
    return dev


def _bump(line, **kw):
    return bump(line.layout, f"git:{line.upstream}@v2", log=quiet, test_runner=runner, **kw)


def test_a_base_that_loses_a_premise_symbol_is_refused_and_nothing_changes(line):
    (line.layout.home / "premise.toml").write_text(PREMISE)
    line.upstream_commit({HYPER: replace_line("class HyperModule:", "class RenamedModule:")}, "upstream: rename",
                         tag="v2")
    before = line.snapshot()
    with pytest.raises(RebaseError) as info:
        _bump(line)
    text = str(info.value)
    assert f"premise: {HYPER} no longer defines HyperModule (the base's mHC is the model)" in text
    assert "enable_hyper_streams" not in text  # still defined: not reported
    assert line.snapshot() == before
    logged = []
    bump(line.layout, f"git:{line.upstream}@v2", log=logged.append, test_runner=runner, allow_broken_premise=True)
    assert any("no longer defines HyperModule" in m and m.startswith("warning:") for m in logged)


def test_a_config_field_the_base_removed_and_a_deleted_file_are_named(line):
    (line.layout.home / "premise.toml").write_text(PREMISE)
    line.upstream_commit({HYPER: replace_line("    enable_hyper_streams: bool = False\n", "    other: int = 1\n")},
                         "upstream: drop the field", tag="v2")
    with pytest.raises(RebaseError, match="no longer defines Config.enable_hyper_streams"):
        _bump(line)
    line.upstream_commit({HYPER: None}, "upstream: delete hyper", tag="v2")
    with pytest.raises(RebaseError, match=f"premise: {HYPER} is not in the new base, so HyperModule is gone"):
        _bump(line)


def test_a_drop_reason_whose_name_the_base_lost_is_refused(line):
    cited = sh("git", "rev-parse", "v1", cwd=line.upstream).strip()
    (line.layout.patches / "dropped").write_text(
        f"# drops\nhyper-module: absorbed: the base has HyperModule with stream_count ({cited[:8]}, #123); "
        f"DeepSeek-V4 style\n")
    line.upstream_commit({HYPER: replace_line("self.stream_count = 4", "self.streams = 4")}, "upstream: rename attr",
                         tag="v2")
    with pytest.raises(RebaseError) as info:
        _bump(line)
    text = str(info.value)
    assert "dropped hyper-module: its reason names stream_count, which the new base no longer defines" in text
    assert "DeepSeek" not in text and "HyperModule" not in text  # unknown to the base / still defined


def test_a_drop_reason_citing_a_commit_the_new_base_lacks_is_refused(line):
    up = line.upstream
    v1 = sh("git", "rev-parse", "v1", cwd=up).strip()
    cited = line.upstream_commit({"megatron/core/gamma.py": replace_line("gamma line 3\n", "gamma line 3 up\n")},
                                 "upstream: the absorbing change", tag="cited")
    pin = line.layout.pin.read_text().replace(v1, cited).replace('ref = "v1"', 'ref = "cited"')
    line.layout.pin.write_text(pin)
    (line.layout.patches / "dropped").write_text(f"gamma-fix: absorbed upstream by {cited[:10]}\n")
    sh("git", "checkout", "-q", "-b", "other", v1, cwd=up)
    line.upstream_commit({"megatron/core/delta.py": replace_line("delta line 3\n", "delta line 3 up\n")},
                         "upstream: elsewhere", tag="v2")
    with pytest.raises(RebaseError, match=f"gamma-fix: its reason cites upstream commit {cited[:10]}, which the new "
                                          f"base does not contain"):
        _bump(line, allow_downgrade=True)


def test_the_dry_run_lists_a_broken_premise_as_a_warning(line):
    (line.layout.home / "premise.toml").write_text(PREMISE)
    line.upstream_commit({HYPER: replace_line("class HyperModule:", "class RenamedModule:")}, "upstream: rename",
                         tag="v2")
    data = forecast.forecast(line.layout, f"git:{line.upstream}@v2")
    assert any("no longer defines HyperModule" in w for w in data["warnings"])


@pytest.mark.parametrize("text, error", [
    ('[[symbol]]\npath = "../x.py"\nname = "A"\n', "plain relative path"),
    ('[[symbol]]\npath = "m/x.py"\nname = "a b"\n', "must be Name or Class.member"),
    ('[[symbol]]\npath = "m/x.txt"\nname = "A"\n', "must be a .py file"),
    ('[[symbol]]\npath = "m/x.py"\n', "needs path and name"),
    ('[other]\n', "unknown table"),
    ('[[symbol]\n', "not valid TOML"),
])
def test_a_malformed_premise_is_an_error_naming_the_entry(text, error):
    with pytest.raises(RebaseError, match=error):
        parse_premise(text, "lines/dev/premise.toml")
