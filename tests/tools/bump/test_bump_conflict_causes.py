"""Conflict causes (issue 15, item 4): the stop puts first the upstream commits that changed the
conflicting lines (blamed, or matched by the lines they deleted), lists the other commits that
touched the files under "also touched these files", and names the conflict type per file."""

import pytest

from tests.tools.bumpkit import make_fork, numbered, quiet, replace_line, sh
from tools.rebase.bump import journal
from tools.rebase.bump.bump import Stopped, bump, bump_continue

B, G, D = "megatron/core/beta.py", "megatron/core/gamma.py", "megatron/core/delta.py"


@pytest.fixture
def fork(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    return make_fork(tmp_path)


def no_runner(layout, name, ids):
    return {i: "passed" for i in ids}


def _stop(fork, resume=False, allow_downgrade=False):
    with pytest.raises(Stopped) as info:
        if resume:
            bump_continue(fork.layout, drop=True, log=quiet, test_runner=no_runner)
        else:
            bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=no_runner,
                 allow_downgrade=allow_downgrade)
    return str(info.value), journal.load(fork.layout).stopped


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
    assert s.kind == "conflict"
    a = s.analysis
    assert a["types"] == {B: "content"}
    assert [c["commit"] for c in a["causes"]] == [cause]
    assert {c["commit"] for c in a["also"]} == {far, far2}
    head, _, rest = text.partition("upstream commits that changed the conflicting lines:")
    assert f"{B} (content conflict)" in head
    causes, _, also = rest.partition("also touched these files:")
    assert f"{cause[:12]} upstream: rewrite beta 5" in causes and far[:12] not in causes
    assert f"{far[:12]} upstream: far beta edit" in also

    text, s = _stop(fork, resume=True)  # drop tweak-beta; fix-gamma: upstream deleted its line
    assert s.analysis["types"] == {G: "content"}
    assert [c["commit"] for c in s.analysis["causes"]] == [deleter]

    text, s = _stop(fork, resume=True)
    assert s.analysis["types"] == {D: "modify/delete"}
    assert f"{D} (modify/delete conflict)" in text and gone[:12] in text

    text, s = _stop(fork, resume=True)
    assert s.analysis["types"] == {"megatron/core/extra.py": "add/add"}
    assert [c["commit"] for c in s.analysis["causes"]] == [added]

    text, s = _stop(fork, resume=True)
    assert set(s.analysis["types"].values()) == {"rename"}
    assert "megatron/core/alpha2.py (rename conflict)" in text


def test_causes_from_an_sdist_base_start_at_the_closest_upstream_version(fork, tmp_path):
    import hashlib
    import tarfile

    # The old base is an sdist of upstream v1 (no history); upstream then moves on in git.
    sdist_dir = tmp_path / "cache" / "sdist"
    sdist_dir.mkdir(parents=True)
    archive = sdist_dir / "megatron_core-0.42.1.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(fork.upstream.rglob("*")):
            rel = path.relative_to(fork.upstream)
            if path.is_file() and ".git" not in rel.parts:
                tar.add(path, arcname=f"megatron_core-0.42.1/{rel.as_posix()}")
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    fork.layout.pin.write_text(f'[upstream]\nkind = "pypi"\npackage = "megatron-core"\nversion = "0.42.1"\n'
                               f'sha256 = "{sha}"\n')
    fork.stack([("tweak-beta", {B: replace_line("beta line 5\n", "beta line 5 fork\n")})])
    before = fork.upstream_commit({B: replace_line("beta line 20\n", "beta line 20 up\n")}, "upstream: far edit")
    cause = fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 up\n")}, "upstream: rewrite beta 5",
                                 tag="v2")
    text, s = _stop(fork, allow_downgrade=True)  # the sdist is dated today: an 'older' git base
    info = s.analysis["files"][B]
    assert info["upstream_from"] == sh("git", "rev-parse", "v1", cwd=fork.upstream).strip()
    assert [c["commit"] for c in s.analysis["causes"]] == [cause]
    assert [c["commit"] for c in s.analysis["also"]] == [before]
    assert "its closest version to the old base" in text
