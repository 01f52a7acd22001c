"""Conflict causes (issue 15, item 4): the stop puts first the upstream commits that changed the
conflicting lines (blamed, or matched by the lines they deleted), lists the other commits that
touched the files under "also touched these files", and names the conflict type per file."""

import pytest

from tests.tools.bumpkit import make_fork, numbered, quiet, replace_line
from tools.rebase import journal
from tools.rebase.bump import Stopped, bump, bump_continue

B, G, D = "megatron/core/beta.py", "megatron/core/gamma.py", "megatron/core/delta.py"


@pytest.fixture
def fork(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    return make_fork(tmp_path)


def no_runner(layout, name, ids):
    return {i: "passed" for i in ids}


def _stop(fork, resume=False):
    with pytest.raises(Stopped) as info:
        if resume:
            bump_continue(fork.layout, drop=True, log=quiet, test_runner=no_runner)
        else:
            bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=no_runner)
    return str(info.value), journal.load(fork.layout)["stopped"]


def test_causes_first_then_also_touched_with_types(fork):
    fork.stack([
        ("tweak-beta", {B: replace_line("beta line 5\n", "beta line 5 fork\n")}),
        ("fix-gamma", {G: replace_line("gamma line 20\n", "gamma line 20 fork\n")}),
        ("edit-delta", {D: replace_line("delta line 7\n", "delta line 7 fork\n")}),
        ("new-file", {"megatron/core/extra.py": "ours = 1\n"}),
        ("move-alpha", {"megatron/core/alpha.py": None, "megatron/core/alpha3.py": numbered("alpha")}),
    ])
    far = fork.upstream_commit({B: replace_line("beta line 30\n", "beta line 30 up\n")}, "upstream: far beta edit")
    cause = fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 up\n")}, "upstream: rewrite beta 5")
    far2 = fork.upstream_commit({B: replace_line("beta line 38\n", "beta line 38 up\n")}, "upstream: another far edit")
    deleter = fork.upstream_commit({G: replace_line("gamma line 20\n", "")}, "upstream: drop gamma 20")
    gone = fork.upstream_commit({D: None}, "upstream: delete delta")
    added = fork.upstream_commit({"megatron/core/extra.py": "theirs = 2\n"}, "upstream: add extra")
    fork.upstream_commit({"megatron/core/alpha.py": None, "megatron/core/alpha2.py": numbered("alpha")},
                         "upstream: move alpha", tag="v2")

    text, s = _stop(fork)
    assert s["kind"] == "conflict"
    a = s["analysis"]
    assert a["types"] == {B: "content"}
    assert [c["commit"] for c in a["causes"]] == [cause]
    assert {c["commit"] for c in a["also"]} == {far, far2}
    head, _, rest = text.partition("upstream commits that changed the conflicting lines:")
    assert f"{B} (content conflict)" in head
    causes, _, also = rest.partition("also touched these files:")
    assert f"{cause[:12]} upstream: rewrite beta 5" in causes and far[:12] not in causes
    assert f"{far[:12]} upstream: far beta edit" in also

    text, s = _stop(fork, resume=True)  # drop tweak-beta; fix-gamma: upstream deleted its line
    assert s["analysis"]["types"] == {G: "content"}
    assert [c["commit"] for c in s["analysis"]["causes"]] == [deleter]

    text, s = _stop(fork, resume=True)
    assert s["analysis"]["types"] == {D: "modify/delete"}
    assert f"{D} (modify/delete conflict)" in text and gone[:12] in text

    text, s = _stop(fork, resume=True)
    assert s["analysis"]["types"] == {"megatron/core/extra.py": "add/add"}
    assert [c["commit"] for c in s["analysis"]["causes"]] == [added]

    text, s = _stop(fork, resume=True)
    assert set(s["analysis"]["types"].values()) == {"rename"}
    assert "megatron/core/alpha2.py (rename conflict)" in text
