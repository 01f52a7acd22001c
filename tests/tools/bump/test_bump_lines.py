"""``bump`` on a line, and ``bump --resolutions-from LINE``: the release line reuses the conflict
resolutions another line recorded when it met the same upstream change first."""

import json
import shutil

import pytest

from tests.tools.bumpkit import (
    A,
    B,
    TWO_PATCH_STACK,
    add_line,
    all_tests_pass,
    make_fork,
    quiet,
    replace_line,
    resolve_conflict,
    sh,
)
from tools.rebase.bump import forecast
from tools.rebase.bump.bump import Stopped, bump, bump_continue
from tools.rebase.cli import main
from tools.rebase.proof.check import check

STACK = TWO_PATCH_STACK



passing = all_tests_pass


def fork_with_line_ahead(tmp_path, alpha_conflict=False):
    """The release line on v1; line ``ahead``, the same stack, already bumped onto v2 (which rewrites
    the line tweak-beta changes, and with ``alpha_conflict`` the one keep-alpha changes) with its
    conflicts resolved and recorded."""
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 upstream\n")}, "upstream: rewrite beta 5")
    if alpha_conflict:
        fork.upstream_commit({A: replace_line("alpha line 10\n", "alpha line 10 upstream\n")}, "upstream: alpha 10")
    sh("git", "tag", "v2", cwd=fork.upstream)
    line = add_line(fork, "ahead")
    shutil.rmtree(line.layout.patches)
    shutil.copytree(fork.layout.patches, line.layout.patches)
    release_before = snapshot_release(fork)
    with pytest.raises(Stopped):
        bump(line.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=passing)
    if alpha_conflict:
        resolve_conflict(line.work, A, "alpha line 10 upstream and fork")
        with pytest.raises(Stopped):
            bump_continue(line.layout, log=quiet, test_runner=passing)
    resolve_conflict(line.work, B, "beta line 5 upstream and fork")
    bump_continue(line.layout, log=quiet, test_runner=passing)
    assert snapshot_release(fork) == release_before, "a line's bump must not touch the release line"
    assert (line.layout.resolutions / "tweak-beta").is_dir()
    assert line.layout.report_md.is_file() and not fork.layout.report_md.exists()
    return fork, line


def snapshot_release(fork):
    files = {p.name: p.read_bytes() for p in (fork.layout.pin, fork.layout.state_file)}
    files.update(fork.patch_files())
    files["work HEAD"] = sh("git", "rev-parse", "HEAD", cwd=fork.work)
    tree = fork.layout.package  # shared by every line: a line's bump (and its tests) must give it back as it was
    files.update({f"megatron/{p.relative_to(tree).as_posix()}": p.read_bytes()
                  for p in sorted(tree.rglob("*")) if p.is_file()})
    return files


def test_dry_run_names_the_line_whose_resolution_resolves_the_stop(tmp_path, cache):
    fork, line = fork_with_line_ahead(tmp_path)
    spec = f"git:{fork.upstream}@v2"
    alone = forecast.forecast(fork.layout, spec)
    assert alone["would_stop"] and alone["counts"] == {"clean": 1, "conflict": 1}
    lent = forecast.forecast(fork.layout, spec, resolutions_from=line.layout)
    assert not lent["would_stop"]
    status = {row["name"]: row["status"] for row in lent["patches"]}
    assert status == {"keep-alpha": "clean",
                      "tweak-beta": "resolved by a recorded resolution of line ahead"}
    assert "| 0002 | `tweak-beta` | resolved by a recorded resolution of line ahead |" in forecast.render(lent)
    assert not fork.layout.resolutions.exists()  # a dry run records nothing


def test_bump_with_resolutions_from_a_line_records_them_as_its_own(tmp_path, cache):
    fork, line = fork_with_line_ahead(tmp_path)
    logged = []
    ran = []
    bump(fork.layout, f"git:{fork.upstream}@v2", log=logged.append, resolutions_from=line.layout,
         test_runner=lambda lay, name, ids: ran.append(name) or passing(lay, name, ids))
    (said,) = [m for m in logged if m.startswith("  tweak-beta: conflict resolved by a recorded resolution of line ahead")]
    assert "(lines/ahead/patches/resolutions/tweak-beta/" in said  # the lender's recording, named
    assert ran == ["keep-alpha", "tweak-beta"]  # every patch's tests, the reused resolution's too
    assert fork.patch_files() == line.patch_files()  # same resolution, same stack
    own = sorted(p.name for p in (fork.layout.resolutions / "tweak-beta").iterdir())
    assert own == sorted(p.name for p in (line.layout.resolutions / "tweak-beta").iterdir())
    assert check(fork.layout, log=quiet) == []
    # the next bump of the release line needs no other line: its own copy resolves the same conflict
    report = json.loads(fork.layout.report_json.read_text())
    row = next(r for r in report["mapping"] if r["new"] and r["new"][0]["subject"] == "tweak-beta")
    assert "recorded resolution" in row["note"]


def test_resolutions_from_is_refused_where_it_cannot_apply(tmp_path, cache, capsys):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    add_line(fork, "ahead")
    base = ["-C", str(fork.root), "bump"]
    assert main(base + ["--continue", "--resolutions-from", "ahead"]) == 2
    assert "--resolutions-from goes with --onto" in capsys.readouterr().err
    assert main(base + ["--line", "ahead", "--onto", f"git:{fork.upstream}@v1", "--resolutions-from", "ahead"]) == 2
    assert "that is the line being bumped" in capsys.readouterr().err
    assert main(base + ["--onto", f"git:{fork.upstream}@v1", "--resolutions-from", "../ahead"]) == 2
    assert "line name '../ahead' must be a plain name" in capsys.readouterr().err
    assert main(base + ["--onto", f"git:{fork.upstream}@v1", "--resolutions-from", "missing"]) == 2
    assert "no folder lines/missing/" in capsys.readouterr().err


def test_continued_bump_still_names_the_lending_line(tmp_path, cache):
    """The lender is in the journal: a bump that stops first (a conflict the line has no resolution
    for) and is continued by a new process still adopts and names the line's resolution later on."""
    fork, line = fork_with_line_ahead(tmp_path, alpha_conflict=True)
    shutil.rmtree(line.layout.resolutions / "keep-alpha")  # the line cannot lend this one
    with pytest.raises(Stopped) as stop:
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, resolutions_from=line.layout, test_runner=passing)
    assert "patch 0001-keep-alpha" in str(stop.value)
    resolve_conflict(fork.work, A, "alpha line 10 upstream and fork")
    logged = []
    bump_continue(fork.layout, log=logged.append, test_runner=passing)
    (said,) = [m for m in logged if m.startswith("  tweak-beta: conflict resolved by a recorded resolution of line ahead")]
    assert "(lines/ahead/patches/resolutions/tweak-beta/" in said  # the lender's recording, named
    assert sorted(p.name for p in fork.layout.resolutions.iterdir()) == ["keep-alpha", "tweak-beta"]
    assert fork.patch_files() == line.patch_files()


def test_a_stop_on_a_line_tells_how_to_continue_that_line(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 upstream\n")}, "upstream: rewrite beta 5")
    sh("git", "tag", "v2", cwd=fork.upstream)
    line = add_line(fork, "ahead")
    shutil.rmtree(line.layout.patches)
    shutil.copytree(fork.layout.patches, line.layout.patches)
    with pytest.raises(Stopped) as stop:
        bump(line.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=passing)
    assert "`python -m tools.rebase bump --line ahead --continue`" in str(stop.value)


def test_seed_then_bump_refreshes_a_line_that_already_has_tool_state(tmp_path, cache):
    """The refresh a maintainer runs when the release stack moved: ``seed --line`` over a line whose
    work repo, state and recorded resolutions come from its own earlier bump, then ``bump --line``
    onto that line's base. The recorded resolution is reused (no stop), the new release patch
    arrives, the line-only Tests: id survives, and the release line is not touched."""
    from tools.rebase.stack.seed import seed_line
    from tools.rebase.stack.series import parse_patch, read_series

    fork, line = fork_with_line_ahead(tmp_path)
    line_only = "tests/test_dummy.py::test_only_on_the_line"
    (fork.root / "tests" / "test_dummy.py").write_text(
        "def test_ok():\n    assert True\n\n\ndef test_only_on_the_line():\n    assert True\n")
    from tools.rebase.stack.workrepo import export

    # the line's own tweak-beta names one more test: amended in its work repo and exported
    message = sh("git", "log", "-1", "--format=%B", cwd=line.work).rstrip("\n")
    assert message.endswith("tests/test_dummy.py::test_ok")
    sh("git", "commit", "-q", "--amend", "-m", message + f"\n {line_only}\n", cwd=line.work)
    export(line.layout, log=quiet)
    fork.stack([("gamma-fork", {"megatron/core/gamma.py": replace_line("gamma line 3\n", "gamma line 3 fork\n")},
                 None, "Why it exists.", "tests/test_dummy.py::test_ok")])
    release_before = snapshot_release(fork)
    seeded = seed_line(line.layout, log=quiet)
    assert seeded.patches == 3 and seeded.kept_tests == {"tweak-beta": [line_only]}
    logged = []
    bump(line.layout, f"git:{fork.upstream}@v2", log=logged.append, test_runner=passing)
    assert read_series(line.layout.series).names == read_series(fork.layout.series).names
    patches = {p.name.split("-", 1)[1]: p for p in line.layout.patches.glob("0*.patch")}
    assert "beta line 5 upstream and fork" in patches["tweak-beta.patch"].read_text()
    assert parse_patch(patches["tweak-beta.patch"]).tests == ["tests/test_dummy.py::test_ok", line_only]
    assert "gamma line 3 fork" in patches["gamma-fork.patch"].read_text()
    assert f'commit = "{sh("git", "rev-parse", "v2", cwd=fork.upstream).strip()}"' in line.layout.pin.read_text()
    assert any("recorded resolution" in str(m) for m in logged), logged
    assert snapshot_release(fork) == release_before


def test_a_git_bump_pins_the_commits_tree_digest(tmp_path, cache):
    """A bump onto a git commit records its ``tree_sha256`` (issue 58), so the line still builds from
    upstream's archive without a mirror: the digest is the commit's, computed from its tree."""
    from tools.rebase.stack.archive import commit_tree_digest
    from tools.rebase.stack.pin import load_pin

    fork = make_fork(tmp_path)
    fork.stack(STACK)
    v2 = fork.upstream_commit({"megatron/core/gamma.py": lambda t: t + "gamma v2\n"}, "upstream v2", tag="v2")
    bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=passing)
    pin = load_pin(fork.layout.pin)
    assert pin.commit == v2 and pin.tree_sha256 == commit_tree_digest(fork.upstream, v2)
