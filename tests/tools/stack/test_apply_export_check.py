"""apply / export / check on small synthetic repos: round trips, and each failure named exactly."""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.tools.conftest import sh
from tools.rebase.proof.check import check
from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import rev_parse
from tools.rebase.stack.workrepo import apply, export

REPO_ROOT = Path(__file__).resolve().parents[3]


def quiet(*_args, **_kwargs):
    pass


def two_patch_stack(fork):
    apply(fork.layout, log=quiet)
    fork.add_patch("alpha-seven", {"megatron/core/alpha.py": lambda t: t.replace("return 7", "return 70")})
    fork.add_patch(
        "beta-extra",
        {"megatron/core/beta.py": lambda t: t + "BETA_EXTRA = 'x'\n", "megatron/core/gamma.py": "G = 1\n"},
        subject="[core] beta: add an extra constant",
    )
    export(fork.layout, log=quiet)


def test_apply_export_round_trip_is_byte_identical(fork):
    two_patch_stack(fork)
    first = fork.patch_files()
    assert list(first) == ["0001-alpha-seven.patch", "0002-beta-extra.patch", "series"]
    assert b"Subject: [core] beta: add an extra constant" in first["0002-beta-extra.patch"]
    tips = []
    for _ in range(2):
        # Rebuild from files only, as on a fresh machine: same commit ids, same files.
        sh("rm", "-rf", fork.layout.state_dir / "work", fork.layout.state_file, fork.layout.package, cwd=fork.root)
        apply(fork.layout, log=quiet)
        tips.append(rev_parse(fork.work, "HEAD"))
        export(fork.layout, log=quiet)
        assert fork.patch_files() == first
    assert tips[0] == tips[1], "commit ids must be reproducible"
    assert fork.patch_files() == first
    assert (fork.root / "megatron/core/alpha.py").read_text().count("return 70") == 1
    assert (fork.root / "megatron/core/gamma.py").read_text() == "G = 1\n"


def test_materialized_version_is_stamped(fork):
    two_patch_stack(fork)
    info = (fork.root / "megatron/core/package_info.py").read_text()
    last = info.strip().splitlines()[-1]
    assert last.startswith("__version__ = '0.42.1+rl.2.")


def test_apply_without_the_package_builds_the_work_repo_and_leaves_megatron_alone(fork):
    two_patch_stack(fork)
    two = fork.patch_files()
    fork.add_patch("gamma-two", {"megatron/core/gamma.py": "G = 2\n"})
    export(fork.layout, log=quiet)  # megatron/ is now the three-patch tree
    before = {p: p.read_bytes() for p in sorted(fork.layout.package.rglob("*")) if p.is_file()}
    for path in fork.layout.patches.glob("*.patch"):
        path.unlink()
    for name, data in two.items():
        (fork.layout.patches / name).write_bytes(data)
    sh("rm", "-rf", fork.layout.state_dir / "work", fork.layout.state_file, cwd=fork.root)
    tip = apply(fork.layout, log=quiet, package=False)  # what a bump does before its backup
    assert sh("git", "show", f"{tip}:megatron/core/gamma.py", cwd=fork.work) == "G = 1\n"
    assert {p: p.read_bytes() for p in sorted(fork.layout.package.rglob("*")) if p.is_file()} == before
    apply(fork.layout, log=quiet)  # the stack is applied now: a plain apply only writes megatron/
    assert (fork.root / "megatron/core/gamma.py").read_text() == "G = 1\n"


def test_second_apply_is_a_no_op(fork):
    two_patch_stack(fork)
    before = {p: p.stat().st_mtime_ns for p in (fork.root / "megatron").rglob("*.py")}
    lines = []
    apply(fork.layout, log=lines.append)
    assert lines and lines[0].startswith("up to date")
    assert {p: p.stat().st_mtime_ns for p in (fork.root / "megatron").rglob("*.py")} == before


def test_export_ignores_user_git_config(fork, tmp_path, monkeypatch):
    two_patch_stack(fork)
    first = fork.patch_files()
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(
        "[diff]\n\tnoprefix = true\n\trenames = false\n\tcontext = 8\n"
        "[format]\n\tsignature = leaked\n\tnumbered = true\n[core]\n\tabbrev = 7\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
    export(fork.layout, log=quiet)
    assert fork.patch_files() == first


def test_export_refuses_uncommitted_changes_and_writes_nothing(fork):
    two_patch_stack(fork)
    first = fork.patch_files()
    (fork.work / "megatron/core/beta.py").write_text("edited but not committed\n")
    with pytest.raises(RebaseError, match="uncommitted changes"):
        export(fork.layout, log=quiet)
    assert fork.patch_files() == first


def test_apply_refuses_to_drop_unexported_commits(fork):
    two_patch_stack(fork)
    fork.add_patch("gamma-two", {"megatron/core/gamma.py": "G = 2\n"})
    with pytest.raises(RebaseError, match="export your commits first"):
        apply(fork.layout, log=quiet)
    assert (fork.work / "megatron/core/gamma.py").read_text() == "G = 2\n"


def test_apply_refuses_hand_edits_in_materialized_tree(fork):
    two_patch_stack(fork)
    (fork.root / "megatron/core/beta.py").write_text("hand edit\n")
    # Change the stack so apply has to rebuild and re-materialize.
    series = fork.layout.series
    series.write_text(series.read_text() + "# a comment\n")
    with pytest.raises(RebaseError, match="local edits"):
        apply(fork.layout, log=quiet)
    assert (fork.root / "megatron/core/beta.py").read_text() == "hand edit\n"


def test_check_passes_on_a_healthy_stack(fork):
    two_patch_stack(fork)
    assert check(fork.layout, log=quiet) == []


def test_check_catches_a_hand_edited_patch(fork):
    two_patch_stack(fork)
    path = fork.layout.patches / "0001-alpha-seven.patch"
    text = path.read_text()
    # Hand edits that still apply but are not what export writes: a hunk header's function
    # context and a dropped index line.
    head, sep, rest = text.partition("@@ -")
    hunk_header, nl, body = rest.partition("\n")
    edited = head + sep + hunk_header.rsplit("@@", 1)[0] + "@@ edited by hand" + nl + body
    edited = "\n".join(line for line in edited.split("\n") if not line.startswith("index "))
    assert edited != text
    path.write_text(edited)
    assert check(fork.layout, log=quiet) == [
        "patches/0001-alpha-seven.patch: differs from a fresh export (edited by hand, or exported "
        "with other flags); run apply then export to regenerate it"
    ]


def test_check_catches_reordered_series(fork):
    two_patch_stack(fork)
    fork.layout.series.write_text("0002-beta-extra.patch\n0001-alpha-seven.patch\n")
    problems = check(fork.layout, log=quiet)
    assert "patches/series:1: 0002-beta-extra.patch is entry 1 but numbered 0002 (reordered series? run export to renumber)" in problems
    assert len(problems) == 2


def test_check_catches_duplicated_series_entry(fork):
    two_patch_stack(fork)
    fork.layout.series.write_text("0001-alpha-seven.patch\n0002-beta-extra.patch\n0001-alpha-seven.patch\n")
    assert check(fork.layout, log=quiet) == [
        "patches/series:3: 0001-alpha-seven.patch is listed twice (first on line 1)"
    ]


def test_check_catches_patch_missing_from_series(fork):
    two_patch_stack(fork)
    fork.layout.series.write_text("0001-alpha-seven.patch\n")
    assert check(fork.layout, log=quiet) == ["patches/0002-beta-extra.patch: not listed in patches/series"]


def test_check_catches_missing_series_file(fork):
    two_patch_stack(fork)
    fork.layout.series.write_text("0001-alpha-seven.patch\n0002-beta-extra.patch\n0003-ghost.patch\n")
    assert check(fork.layout, log=quiet) == ["patches/series:3: 0003-ghost.patch does not exist"]


def test_check_catches_tests_trailer_naming_missing_test(fork):
    apply(fork.layout, log=quiet)
    fork.add_patch(
        "alpha-seven",
        {"megatron/core/alpha.py": lambda t: t.replace("return 7", "return 70")},
        tests="tests/test_dummy.py::test_ok\n tests/test_dummy.py::test_gone\n tests/test_nowhere.py",
    )
    export(fork.layout, log=quiet)
    assert check(fork.layout, log=quiet) == [
        "patches/0001-alpha-seven.patch: Tests: tests/test_dummy.py::test_gone: tests/test_dummy.py has no test_gone",
        "patches/0001-alpha-seven.patch: Tests: tests/test_nowhere.py: tests/test_nowhere.py does not exist",
    ]


def test_check_catches_missing_trailers(fork):
    two_patch_stack(fork)
    path = fork.layout.patches / "0001-alpha-seven.patch"
    path.write_text(path.read_text().replace("Upstream-Status: fork-only test fixture\n", ""))
    problems = check(fork.layout, log=quiet)
    assert problems == ["patches/0001-alpha-seven.patch: missing 'Upstream-Status:' trailer"]


def test_check_catches_checksum_mismatch(fork, tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_ALLOW_PACKAGE", "fake-pkg")
    # A pypi pin whose cached sdist does not match the recorded sha256.
    cache = Path(os.environ["FORK_REBASE_CACHE"]) / "sdist"
    cache.mkdir(parents=True)
    src = tmp_path / "pkg" / "fake_pkg-1.0"
    (src / "megatron/core").mkdir(parents=True)
    (src / "megatron/core/package_info.py").write_text("MAJOR=1\nMINOR=0\nPATCH=0\nPRE_RELEASE=''\n")
    with tarfile.open(cache / "fake_pkg-1.0.tar.gz", "w:gz") as tar:
        tar.add(src, arcname="fake_pkg-1.0")
    fork.layout.pin.write_text(
        '[upstream]\nkind = "pypi"\npackage = "fake-pkg"\nversion = "1.0"\nsha256 = "' + "0" * 64 + '"\n'
    )
    problems = check(fork.layout, log=quiet)
    assert len(problems) == 1
    assert problems[0].startswith("upstream pin: checksum mismatch for fake-pkg==1.0: the pin says sha256 " + "0" * 64)
    assert "nothing was applied" in problems[0]
    with pytest.raises(RebaseError, match="checksum mismatch"):
        apply(fork.layout, log=quiet)
    assert not fork.layout.package.exists()


def _malformed(fork, mutate):
    two_patch_stack(fork)
    tip = rev_parse(fork.work, "HEAD")
    path = fork.layout.patches / "0002-beta-extra.patch"
    path.write_text(mutate(path.read_text()))
    before_pkg = sorted(p.read_bytes() for p in fork.layout.package.rglob("*.py"))
    with pytest.raises(RebaseError) as info:
        apply(fork.layout, log=quiet)
    # Nothing half-applied: work repo, its checkout and megatron/ are as they were.
    assert rev_parse(fork.work, "HEAD") == tip
    assert sh("git", "status", "--porcelain", cwd=fork.work) == ""
    assert sh("git", "worktree", "list", "--porcelain", cwd=fork.work).count("worktree ") == 1
    assert sorted(p.read_bytes() for p in fork.layout.package.rglob("*.py")) == before_pkg
    return str(info.value), path


def test_malformed_hunk_is_named_with_file_and_line(fork):
    def drop_hunk_line(text):
        return text.replace("+BETA_EXTRA = 'x'\n", "", 1)

    message, path = _malformed(fork, drop_hunk_line)
    assert message.startswith(f"{path}:")
    lines = path.read_text().splitlines()
    line = int(message.split(":")[1])
    assert lines[line - 1].startswith("diff --git"), message  # where the hunk ran short
    start = int(message.split("hunk starting at line ")[1].split()[0])
    assert lines[start - 1].startswith("@@ ") and "beta.py" in lines[start - 2], message


def test_patch_not_applying_names_the_patch_and_leaves_nothing(fork):
    message, path = _malformed(fork, lambda t: t.replace(" BETA_29 = 29", " BETA_29 = 2900"))
    assert message.startswith("0002-beta-extra.patch does not apply")


@pytest.mark.parametrize("evil", ["../outside.py", "/etc/passwd", "megatron/../../x.py", ".git/hooks/post-checkout"])
def test_patch_touching_path_outside_tree_is_refused(fork, evil):
    def retarget(text):
        return text.replace("megatron/core/gamma.py", evil)

    message, path = _malformed(fork, retarget)
    assert "refusing path outside the tree" in message and evil.lstrip("/") in message
    assert message.startswith(f"{path}:")
    assert not (fork.root.parent / "outside.py").exists()


def test_cli_works_from_a_subdirectory(fork):
    two_patch_stack(fork)
    sub = fork.root / "megatron" / "core"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "tools.rebase", "check"], cwd=sub, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "check: ok" in proc.stdout
    fork.layout.series.write_text("0001-alpha-seven.patch\n")
    proc = subprocess.run(
        [sys.executable, "-m", "tools.rebase", "check"], cwd=sub, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 1
    assert "check: patches/0002-beta-extra.patch: not listed in patches/series" in proc.stderr


def test_series_comments_survive_export(fork):
    two_patch_stack(fork)
    fork.layout.series.write_text(
        "# header\n0001-alpha-seven.patch\n\n# beta needs alpha\n0002-beta-extra.patch\n# end\n"
    )
    export(fork.layout, log=quiet)
    assert fork.layout.series.read_text() == (
        "# header\n0001-alpha-seven.patch\n\n# beta needs alpha\n0002-beta-extra.patch\n# end\n"
    )


def test_check_catches_stale_readme_table(fork):
    from tools.rebase.proof.listing import BEGIN, END, update_readme

    two_patch_stack(fork)
    readme = fork.root / "README.md"
    readme.write_text(f"# fork\n\n{BEGIN}\n{END}\n\nmore\n")
    assert check(fork.layout, log=quiet) == [
        "README.md: the patch table is stale; run python -m tools.rebase list --update-readme"
    ]
    assert update_readme(fork.layout)
    text = readme.read_text()
    assert "| 0002 | `beta-extra` | fork-only | not recorded |" in text
    assert text.endswith(f"{END}\n\nmore\n")
    assert check(fork.layout, log=quiet) == []


def test_apply_force_restores_hand_edits_in_materialized_tree(fork):
    two_patch_stack(fork)
    beta = fork.root / "megatron/core/beta.py"
    expected = beta.read_text()
    beta.write_text("hand edit\n")
    (fork.root / "megatron/core/stray.py").write_text("x = 1\n")
    apply(fork.layout, force=True, log=quiet)
    assert beta.read_text() == expected
    assert not (fork.root / "megatron/core/stray.py").exists()
