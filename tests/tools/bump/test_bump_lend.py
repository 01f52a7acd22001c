"""Every line's work is lent (issue 54, item 3): at a stop, another line's version of the same patch
(matched by Patch-Name) is tried three-way on the conflicted files; one that resolves them is
offered by line, the forecast counts such stops, and ``--continue --take-from LINE`` takes it and
records it like a resolution made by hand."""

import pytest

from tests.tools.bumpkit import add_line, make_fork, quiet, replace_line, sh
from tools.rebase.bump import forecast, journal
from tools.rebase.bump.bump import Stopped, bump, bump_continue
from tools.rebase.errors import RebaseError
from tools.rebase.stack.workrepo import apply

B, G = "megatron/core/beta.py", "megatron/core/gamma.py"


def runner(layout, name, ids):
    return {i: "passed" for i in ids}


@pytest.fixture
def fork(tmp_path, monkeypatch):
    """Release line: tweak-beta (line 5) and fix-gamma (line 9) on v1. Upstream v2 rewrites both
    lines. Line ``main`` already carries tweak-beta on v2; line ``stale`` has it on v1 only."""
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork = make_fork(tmp_path)
    fork.stack([("tweak-beta", {B: replace_line("beta line 5\n", "beta line 5 fork\n")}),
                ("fix-gamma", {G: replace_line("gamma line 9\n", "gamma line 9 fork\n")})])
    v1_pin = fork.layout.pin.read_text()
    v2 = fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 up\n"),
                               G: replace_line("gamma line 9\n", "gamma line 9 up\n")}, "upstream v2", tag="v2")
    main = add_line(fork, "main", pin_text=v1_pin.replace(sh("git", "rev-parse", "v1", cwd=fork.upstream).strip(), v2)
                    .replace('ref = "v1"', 'ref = "v2"'))
    main.stack([("tweak-beta", {B: replace_line("beta line 5 up\n", "beta line 5 up fork\n")})])
    stale = add_line(fork, "stale")
    stale.stack([("tweak-beta", {B: replace_line("beta line 5\n", "beta line 5 stale\n")})])
    apply(fork.layout, log=quiet)
    return fork


def _stop(fork):
    with pytest.raises(Stopped) as info:
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=runner)
    return str(info.value), journal.load(fork.layout).stopped


def test_the_stop_offers_the_line_whose_version_resolves_it_and_take_from_records_it(fork):
    text, s = _stop(fork)
    lent = {c["line"]: c for c in s.analysis["lent"]}
    assert set(lent) == {"main", "stale"}  # every other line with the patch is tried
    assert lent["main"]["missing"] == [] and set(lent["main"]["files"]) == {B}
    assert lent["stale"]["files"] == {} and lent["stale"]["missing"] == [B]
    assert "line main's version of this patch applies to every conflicted file" in text
    assert "--continue --take-from main" in text and "take-from stale" not in text

    with pytest.raises(RebaseError, match="does not apply without a conflict to megatron/core/beta.py"):
        bump_continue(fork.layout, take_from="stale", log=quiet, test_runner=runner)
    with pytest.raises(Stopped):  # taken; the next patch (fix-gamma: main has no version) stops
        bump_continue(fork.layout, take_from="main", log=quiet, test_runner=runner)
    s = journal.load(fork.layout).stopped
    assert journal.load(fork.layout).names[s.index] == "fix-gamma"
    assert s.analysis["lent"] == []  # no other line has fix-gamma
    taken = sh("git", "show", f"{journal.load(fork.layout).tip}:{B}", cwd=fork.work)
    assert "beta line 5 up fork\n" in taken and "<<<<<<<" not in taken
    outcome = [o for o in journal.load(fork.layout).outcomes if o.name == "tweak-beta"][0]
    assert outcome.outcome == "resolved-manual"
    bump_continue(fork.layout, drop=True, log=quiet, test_runner=runner)
    recorded = list((fork.layout.resolutions / "tweak-beta").iterdir())
    assert recorded, "the taken version is recorded like a resolution by hand"


def test_take_from_names_a_line_without_the_patch(fork):
    _stop(fork)
    with pytest.raises(RebaseError, match="line release has no patch named|that is the line being bumped"):
        bump_continue(fork.layout, take_from="release", log=quiet, test_runner=runner)
    with pytest.raises(RebaseError, match="no folder"):
        bump_continue(fork.layout, take_from="nosuch", log=quiet, test_runner=runner)


def test_the_forecast_counts_the_stops_another_line_resolves(fork):
    data = forecast.forecast(fork.layout, f"git:{fork.upstream}@v2")
    assert data["lendable"] == 1
    rows = {r["name"]: r for r in data["patches"]}
    assert rows["tweak-beta"]["lent"] == ["main"] and rows["fix-gamma"]["lent"] == []
    text = forecast.render(data)
    assert "Conflicts another line's version of the patch resolves: 1 of 2" in text
