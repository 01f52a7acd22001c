"""Issue 14: the pin, the patch files and ``--onto`` are untrusted (they come from pull requests).

Each test replays an attack or fault on a small synthetic checkout and checks that the tool refuses
it with an error naming what is wrong and where, and that nothing ran or changed.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.tools.bumpkit import commit, init, patch_msg, sh
from tests.tools.sdists import write_sdist
from tools.rebase.proof.check import check
from tools.rebase.cli import main
from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import rev_parse
from tools.rebase.stack.workrepo import apply, export


def quiet(*_args, **_kwargs):
    pass


def two_patch_stack(fork):
    apply(fork.layout, log=quiet)
    fork.add_patch("alpha-seven", {"megatron/core/alpha.py": lambda t: t.replace("return 7", "return 70")})
    fork.add_patch("beta-extra", {"megatron/core/beta.py": lambda t: t + "BETA_EXTRA = 'x'\n",
                                  "megatron/core/gamma.py": "G = 1\n"})
    export(fork.layout, log=quiet)


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


# ---------------------------------------------------------------- 1. option injection into git

def _injection_url(marker: Path, upstream: Path) -> str:
    # The command runs as git's upload-pack and still serves the real repository, so the fetch
    # even succeeds: only the marker shows that it ran.
    return f"--upload-pack=touch {marker};git-upload-pack {upstream};:"


def test_pin_url_option_injection_is_refused_by_check_and_apply(fork, tmp_path):
    marker = tmp_path / "MARKER"
    sha = sh("git", "rev-parse", "v1", cwd=fork.upstream).strip()
    fork.layout.pin.write_text(
        f'[upstream]\nkind = "git"\nurl = "{_injection_url(marker, fork.upstream)}"\ncommit = "{sha}"\n')
    problems = check(fork.layout, log=quiet)
    assert len(problems) == 1
    assert problems[0].startswith(f"{fork.layout.pin}: url '--upload-pack=")
    assert "starts with '-'" in problems[0]
    with pytest.raises(RebaseError, match=r"upstream.toml: url '--upload-pack=.*starts with '-'"):
        apply(fork.layout, log=quiet)
    assert not marker.exists()
    assert not fork.layout.package.exists()


def test_onto_option_injection_is_refused_by_bump(fork, tmp_path, capsys):
    two_patch_stack(fork)
    before = fork.snapshot()
    marker = tmp_path / "MARKER"
    spec = f"git:{_injection_url(marker, fork.upstream)}@{fork.upstream}"
    code, _, err = run_cli(capsys, "-C", fork.root, "bump", "--onto", spec)
    assert code == 2
    assert "--onto" in err and "url '--upload-pack=" in err and "starts with '-'" in err
    assert not marker.exists()
    assert fork.snapshot() == before


@pytest.mark.parametrize("spec, field", [
    ("git:{upstream}@--upload-pack=touch {marker}", "ref"),
    ("git:{upstream}@main:refs/heads/evil", "ref"),
    ("git:ext::sh -c touch% {marker}@main", "url"),
    ("pypi:--index-url==1.0", "package"),
    ("pypi:megatron-core==-1", "version"),
])
def test_onto_spec_fields_that_git_or_pip_would_misread_are_refused(fork, tmp_path, capsys, spec, field):
    two_patch_stack(fork)
    marker = tmp_path / "MARKER"
    code, _, err = run_cli(capsys, "-C", fork.root, "bump", "--onto",
                           spec.format(upstream=fork.upstream, marker=marker))
    assert code == 2 and "--onto" in err and f" {field} " in err, err
    assert not marker.exists()


def test_fetch_ends_options_even_if_validation_is_bypassed(fork, tmp_path, monkeypatch):
    """Second layer: the URL reaches git after ``--``, so it is never an option."""
    from tools.rebase.stack import gitsource

    monkeypatch.setattr(gitsource.names, "git_url", lambda value, *a, **k: value)
    marker = tmp_path / "MARKER"
    with pytest.raises(RebaseError, match="could not fetch"):
        gitsource.resolve_git_ref(tmp_path / "cache", _injection_url(marker, fork.upstream), "main")
    with pytest.raises(RebaseError, match="could not fetch"):
        gitsource.fetch_git_commit(_new_repo(tmp_path), tmp_path / "cache",
                                   _injection_url(marker, fork.upstream), "0" * 40)
    assert not marker.exists()


def _new_repo(tmp_path):
    repo = tmp_path / "empty"
    init(repo, {"x": "1\n"})
    return repo


@pytest.mark.parametrize("table, message", [
    ('kind = "pypi"\npackage = "p"\nversion = "1"\nsha256 = 1234', "sha256 must be a string"),
    ('kind = "pypi"\npackage = "p"\nversion = "1"\nsha256 = ["' + "a" * 64 + '"]', "sha256 must be a string"),
    ('kind = "pypi"\npackage = "../../p"\nversion = "1"\nsha256 = "' + "a" * 64 + '"', "package '../../p'"),
    ('kind = "pypi"\npackage = "p"\nversion = "1/../../../x"\nsha256 = "' + "a" * 64 + '"', "version '1/../../../x'"),
    ('kind = "pypi"\npackage = "-p"\nversion = "1"\nsha256 = "' + "a" * 64 + '"', "package '-p' starts with '-'"),
    ('kind = "git"\nurl = "/x"\ncommit = 12', "commit must be a full 40-hex commit id"),
    ('kind = "git"\nurl = "/x"\ncommit = "' + "a" * 40 + '"\nref = "-b"', "ref '-b' starts with '-'"),
    ('kind = "git"\nurl = "/x"\ncommit = "' + "a" * 40 + '"\nref = "a:b"', "ref 'a:b' is not a plain"),
    ('kind = "git"\nurl = "ext::sh -c x"\ncommit = "' + "a" * 40 + '"', "git remote helper"),
    ('kind = "git"\nurl = "/x\\ny"\ncommit = "' + "a" * 40 + '"', "control character"),
])
def test_bad_pin_fields_are_named_with_the_file(fork, table, message):
    fork.layout.pin.write_text(f"[upstream]\n{table}\n")
    problems = check(fork.layout, log=quiet)
    assert len(problems) == 1 and problems[0].startswith(f"{fork.layout.pin}: "), problems
    assert message in problems[0], problems


# ---------------------------------------------------------------- 2 and 8. the sdist and its sha256

def _sdist(path: Path, marker: Path, tag: str) -> str:
    """A fake-pkg 1.0 sdist whose in-tree build backend writes ``marker`` when pip loads it."""
    backend = (
        f"open({str(marker)!r}, 'w').write({tag!r})\n"
        "import os\n"
        "def prepare_metadata_for_build_wheel(d, config_settings=None):\n"
        "    info = os.path.join(d, 'fake_pkg-1.0.dist-info')\n"
        "    os.makedirs(info)\n"
        "    open(os.path.join(info, 'METADATA'), 'w').write('Metadata-Version: 2.1\\nName: fake-pkg\\nVersion: 1.0\\n')\n"
        "    return 'fake_pkg-1.0.dist-info'\n"
    )
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
        "backend.py": backend,
        "PKG-INFO": f"Metadata-Version: 2.1\nName: fake-pkg\nVersion: 1.0\nSummary: {tag}\n",
        "megatron/core/package_info.py": "MAJOR = 1\nMINOR = 0\nPATCH = 0\nPRE_RELEASE = ''\n",
    }
    return write_sdist(path, "fake_pkg-1.0", files)


def _pypi_pin(fork, sha256: str):
    fork.layout.pin.write_text(
        f'[upstream]\nkind = "pypi"\npackage = "fake-pkg"\nversion = "1.0"\nsha256 = "{sha256}"\n')


@pytest.fixture(autouse=True)
def allow_test_packages(monkeypatch):
    """These tests pin synthetic sdists (fake-pkg, p): a maintainer's allowance, from the environment."""
    monkeypatch.setenv("FORK_REBASE_ALLOW_PACKAGE", "fake-pkg,p")


def test_tampered_sdist_is_refused_before_its_build_code_runs(fork, tmp_path, find_links):
    marker = tmp_path / "MARKER"
    genuine = _sdist(tmp_path / "genuine" / "fake_pkg-1.0.tar.gz", marker, "genuine")
    tampered = _sdist(find_links / "fake_pkg-1.0.tar.gz", marker, "tampered")
    assert genuine != tampered
    _pypi_pin(fork, genuine)
    problems = check(fork.layout, log=quiet)
    assert len(problems) == 1, problems
    assert "could not download the sdist of fake-pkg==1.0" in problems[0]
    assert f"expected sha256 {genuine}" in problems[0] and tampered in problems[0]
    with pytest.raises(RebaseError, match="nothing from it was run or cached"):
        apply(fork.layout, log=quiet)
    assert not marker.exists(), "the tampered sdist's build backend ran"
    assert not list((tmp_path / "cache").rglob("*.tar.gz"))


def test_hash_checked_download_reports_progress_and_caches(tmp_path, find_links):
    from tools.rebase.stack.source import download_sdist, sha256_file

    sha = _sdist(find_links / "fake_pkg-1.0.tar.gz", tmp_path / "MARKER", "genuine")
    lines = []
    path = download_sdist(tmp_path / "cache", "fake-pkg", "1.0", sha, log=lines.append)
    assert path == tmp_path / "cache" / "sdist" / "fake_pkg-1.0.tar.gz"
    assert sha256_file(path) == sha
    assert lines[0].startswith("downloading the sdist of fake-pkg==1.0 (sha256 " + sha[:12])
    size = path.stat().st_size
    assert len(lines) == 2 and f"{size:,} bytes" in lines[-1] and str(path) in lines[-1]


def test_a_changed_later_digit_of_the_pin_fails_although_the_base_is_cached(fork, tmp_path):
    sha = _sdist(tmp_path / "cache" / "sdist" / "fake_pkg-1.0.tar.gz", tmp_path / "MARKER", "genuine")
    (tmp_path / "MARKER").unlink(missing_ok=True)
    _pypi_pin(fork, sha)
    apply(fork.layout, log=quiet)  # imports and tags the base (the tag names 12 hex digits)
    assert check(fork.layout, log=quiet) == []
    other = sha[:40] + ("0" if sha[40] != "0" else "1") + sha[41:]
    _pypi_pin(fork, other)
    problems = check(fork.layout, log=quiet)
    assert len(problems) == 1 and "checksum mismatch" in problems[0] and other in problems[0], problems
    with pytest.raises(RebaseError, match="checksum mismatch"):
        apply(fork.layout, log=quiet)


def test_pip_errors_are_cut_at_line_boundaries():
    from tools.rebase.stack.source import _tail_lines

    text = "\n".join(f"line {i} " + "x" * 90 for i in range(100))
    tail = _tail_lines(text, limit=500)
    lines = tail.splitlines()
    assert lines[0] == "..." and len(tail) <= 510
    assert all(line in text.splitlines() for line in lines[1:])
    assert lines[-1] == text.splitlines()[-1]


# ---------------------------------------------------------------- 7. symlinks

def _symlink_patch(tmp_path, target: str) -> bytes:
    """format-patch output of a commit adding megatron/core/leak.py as a symlink to ``target``."""
    repo = tmp_path / "linkrepo"
    init(repo, {"megatron/core/x.py": "x = 1\n"})
    os.symlink(target, repo / "megatron/core/leak.py")
    commit(repo, {}, patch_msg("add-link"))
    return sh("git", "format-patch", "--stdout", "-1", "HEAD", cwd=repo).encode()


def test_patch_adding_a_symlink_is_refused(fork, tmp_path):
    two_patch_stack(fork)
    secret = tmp_path / "secret.txt"
    secret.write_text("outside the tree\n")
    path = fork.layout.patches / "0003-add-link.patch"
    path.write_bytes(_symlink_patch(tmp_path, str(secret)))
    fork.layout.series.write_text(fork.layout.series.read_text() + "0003-add-link.patch\n")
    with pytest.raises(RebaseError, match=r"0003-add-link.patch:\d+: refusing a symlink"):
        apply(fork.layout, log=quiet)
    assert any("refusing a symlink" in p for p in check(fork.layout, log=quiet))
    assert not (fork.root / "megatron/core/leak.py").exists()


@pytest.mark.parametrize("kind", ["outside-file", "loop"])
def test_materialize_refuses_symlinks_in_the_tree(tmp_path, kind):
    from tools.rebase.stack.materialize import materialize

    tree = tmp_path / "work"
    (tree / "megatron/core").mkdir(parents=True)
    (tree / "megatron/core/package_info.py").write_text("MAJOR = 1\n")
    if kind == "outside-file":
        (tmp_path / "secret.txt").write_text("secret\n")
        os.symlink(tmp_path / "secret.txt", tree / "megatron/core/leak.py")
        name = "leak.py"
    else:
        os.symlink("..", tree / "megatron/core/loop")
        name = "loop"
    with pytest.raises(RebaseError, match=rf"megatron/core/{name}: is a symlink"):
        materialize(tree, tmp_path / "megatron", "1.0+rl.0.0")
    assert not (tmp_path / "megatron").exists()
    assert not (tmp_path / "megatron.tmp-materialize").exists()


def test_export_refuses_a_committed_symlink_before_writing(fork, tmp_path):
    two_patch_stack(fork)
    before = fork.patch_files()
    os.symlink("/etc/hostname", fork.work / "megatron/core/leak.py")
    commit(fork.work, {}, patch_msg("add-link"))
    with pytest.raises(RebaseError, match="adds a symlink, 'megatron/core/leak.py'"):
        export(fork.layout, log=quiet)
    assert fork.patch_files() == before


# ---------------------------------------------------------------- 11. names that become paths

def test_patch_name_with_traversal_is_refused(fork, tmp_path):
    two_patch_stack(fork)
    path = fork.layout.patches / "0002-beta-extra.patch"
    path.write_text(path.read_text().replace("Patch-Name: beta-extra", "Patch-Name: ../../../evil"))
    with pytest.raises(RebaseError, match=r"0002-beta-extra.patch: Patch-Name '../../../evil'"):
        apply(fork.layout, log=quiet)
    assert any("Patch-Name '../../../evil'" in p for p in check(fork.layout, log=quiet))


def test_resolutions_refuse_unsafe_names(fork, tmp_path):
    from tools.rebase.bump.resolutions import export_resolutions, import_resolutions

    two_patch_stack(fork)
    rr = fork.work / ".git" / "rr-cache" / ("a" * 40)
    rr.mkdir(parents=True)
    (rr / "preimage").write_text("x\n")
    (rr / "postimage").write_text("y\n")
    store = fork.layout.resolutions
    with pytest.raises(RebaseError, match=r"Patch-Name\) '../../escaped'"):
        export_resolutions(fork.work, store, "../../escaped", ["a" * 40])
    with pytest.raises(RebaseError, match="not a 40-hex rerere id"):
        export_resolutions(fork.work, store, "alpha-seven", ["../../../x"])
    assert not (fork.root.parent / "escaped").exists() and not store.exists()
    (store / "alpha-seven").mkdir(parents=True)
    os.symlink(tmp_path, store / "alpha-seven" / ("b" * 40))
    with pytest.raises(RebaseError, match="must not be symlinks"):
        import_resolutions(store, fork.work)


def test_sdist_path_refuses_traversal():
    from tools.rebase.stack.source import sdist_path

    with pytest.raises(RebaseError, match="version '../../../x'"):
        sdist_path(Path("/cache"), "megatron-core", "../../../x")


@pytest.mark.parametrize("node_id, why", [
    ("-pevil_plugin", "starts with '-'"),
    ("--rootdir=/", "starts with '-'"),
    ("/abs/tests/test_x.py", "relative path inside tests/"),
    ("tests/../../outside/test_x.py", "relative path inside tests/"),
    ("tools/test_x.py", "relative path inside tests/"),
])
def test_tests_ids_must_be_relative_paths_inside_tests(fork, node_id, why):
    apply(fork.layout, log=quiet)
    fork.add_patch("alpha-seven", {"megatron/core/alpha.py": lambda t: t.replace("return 7", "return 70")},
                   tests=f"tests/test_dummy.py::test_ok {node_id}")
    export(fork.layout, log=quiet)
    problems = check(fork.layout, log=quiet)
    assert len(problems) == 1 and problems[0].startswith(f"patches/0001-alpha-seven.patch: Tests: {node_id}: ")
    assert why in problems[0]


def test_pytest_runner_never_passes_an_option(fork, tmp_path):
    from tools.rebase.bump.bump import pytest_runner

    marker = tmp_path / "conftest-ran"
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "conftest.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    results = pytest_runner(fork.layout, "p", [f"--rootdir={tmp_path / 'evil'}", "-pno:terminal",
                                               "tests/test_dummy.py::test_ok"])
    assert results["tests/test_dummy.py::test_ok"] == "passed"
    assert results[f"--rootdir={tmp_path / 'evil'}"].startswith("refused: starts with '-'")
    assert results["-pno:terminal"].startswith("refused")
    assert not marker.exists()


# ---------------------------------------------------------------- 13. merges in a report range

def test_report_refuses_a_range_with_an_evil_merge(tmp_path, fork, capsys):
    repo = tmp_path / "stacks"
    base = init(repo, {"a.py": "a = 1\n", "b.py": "b = 1\n"})
    old_tip = commit(repo, {"a.py": "a = 2\n"}, patch_msg("p1"))
    sh("git", "checkout", "-q", "-b", "side", base, cwd=repo)
    commit(repo, {"b.py": "b = 2\n"}, patch_msg("p2"))
    sh("git", "checkout", "-q", "main", cwd=repo)
    sh("git", "merge", "-q", "--no-ff", "--no-commit", "side", cwd=repo)
    (repo / "a.py").write_text("a = 'evil'\n")  # a change only the merge carries
    sh("git", "commit", "-q", "-am", "Merge side", cwd=repo)
    merge = sh("git", "rev-parse", "HEAD", cwd=repo).strip()
    out = tmp_path / "r.md"
    code, _, err = run_cli(capsys, "-C", fork.root, "report", "--repo", repo, "--old", f"{base}..{old_tip}",
                           "--new", f"{base}..{merge}", "--output", out)
    assert code == 2
    assert f"new range {base[:12]}..{merge[:12]} contains 1 merge commit(s), e.g. {merge[:12]} ('Merge side')" in err
    assert not out.exists()


def test_report_with_a_missing_repo_or_an_option_as_revision_is_a_clean_error(tmp_path, fork, capsys):
    out = tmp_path / "r.md"
    code, _, err = run_cli(capsys, "-C", fork.root, "report", "--repo", tmp_path / "nope",
                           "--old", "a..b", "--new", "a..c", "--output", out)
    assert code == 2 and f"--repo {tmp_path / 'nope'}: no such directory" in err
    code, _, err = run_cli(capsys, "-C", fork.root, "report", "--repo", fork.upstream,
                           f"--old=--output={tmp_path / 'x'}..HEAD", "--new", "HEAD..HEAD", "--output", out)
    assert code == 2 and "starts with '-'" in err
    assert not list(tmp_path.glob("x*")) and not out.exists()


# ---------------------------------------------------------------- the Low list

def test_a_users_global_excludes_file_does_not_hide_untracked_work(fork, tmp_path, monkeypatch):
    two_patch_stack(fork)
    home = tmp_path / "home"
    (home / ".config" / "git").mkdir(parents=True)
    (home / ".config" / "git" / "ignore").write_text("*.py\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    (fork.work / "megatron/core/new_module.py").write_text("NEW = 1\n")
    with pytest.raises(RebaseError, match="uncommitted changes"):
        export(fork.layout, log=quiet)


def test_export_checks_local_edits_before_writing(fork):
    two_patch_stack(fork)
    before = fork.patch_files()
    fork.add_patch("gamma-two", {"megatron/core/gamma.py": "G = 2\n"})
    (fork.root / "megatron/core/beta.py").write_text("hand edit\n")
    with pytest.raises(RebaseError, match="local edits.*Nothing was written"):
        export(fork.layout, log=quiet)
    assert fork.patch_files() == before
    assert (fork.root / "megatron/core/beta.py").read_text() == "hand edit\n"


def test_dash_c_to_a_missing_or_foreign_folder_is_an_error(tmp_path, capsys):
    code, _, err = run_cli(capsys, "-C", tmp_path / "missing", "list")
    assert code == 2 and f"-C {tmp_path / 'missing'}: no such directory" in err
    code, out, err = run_cli(capsys, "-C", tmp_path, "list")
    assert code == 2 and "no upstream.toml and patches/ found" in err and out == ""


@pytest.mark.parametrize("damage", ["corrupt-manifest", "dangling-symlink"])
def test_damaged_materialized_tree_is_a_clean_error(fork, capsys, damage):
    two_patch_stack(fork)
    if damage == "corrupt-manifest":
        (fork.root / "megatron/.fork-manifest.json").write_text("{not json")
        expected = "manifest .fork-manifest.json is corrupt"
    else:
        os.symlink("/nonexistent/target", fork.root / "megatron/core/dangling.py")
        expected = "core/dangling.py"
    fork.layout.series.write_text(fork.layout.series.read_text() + "# rebuild\n")
    code, _, err = run_cli(capsys, "-C", fork.root, "apply")
    assert code == 2 and "local edits" in err and expected in err, err


@pytest.mark.parametrize("evil", ['"a/\\056git/config"', "a/.GIT/config", "a/megatron/.Git/hooks/x",
                                  '"a/megatron/\\056\\056/\\056\\056/x.py"'])
def test_path_check_sees_through_c_quoting_and_case(fork, evil):
    two_patch_stack(fork)
    tip = rev_parse(fork.work, "HEAD")
    path = fork.layout.patches / "0002-beta-extra.patch"
    quoted = evil.startswith('"')
    bare = evil.strip('"')[2:]
    text = path.read_text()
    for side in ("a", "b"):
        target = f'"{side}/{bare}"' if quoted else f"{side}/{bare}"
        text = text.replace(f"{side}/megatron/core/gamma.py", target)
    path.write_text(text)
    with pytest.raises(RebaseError, match=r"0002-beta-extra.patch:\d+: refusing path outside the tree"):
        apply(fork.layout, log=quiet)
    assert rev_parse(fork.work, "HEAD") == tip


def test_apply_errors_do_not_quote_git_am_resume_advice(fork):
    two_patch_stack(fork)
    path = fork.layout.patches / "0002-beta-extra.patch"
    path.write_text(path.read_text().replace(" BETA_29 = 29", " BETA_29 = 2900"))
    with pytest.raises(RebaseError) as info:
        apply(fork.layout, log=quiet)
    message = str(info.value)
    assert message.startswith("0002-beta-extra.patch does not apply")
    assert "Patch failed at" in message or "error:" in message
    for advice in ("git am --", "hint:", "--show-current-patch", "build-"):
        assert advice not in message, message




# ---------------------------------------------------------------- a local path in the pin borrows nothing

def _git(*args, cwd, input=None):
    return subprocess.run(["git", *map(str, args)], cwd=cwd, input=input, capture_output=True, text=True)


def test_a_pin_path_copies_the_pinned_history_but_never_borrows_the_outside_object_store(fork, tmp_path,
                                                                                      monkeypatch):
    """A pin may name a local repository, but only the pinned commit's history is copied in:
    the outside object store is never linked (git alternates), so nothing else in it becomes
    readable. Borrowing is for a ``--mirror`` the maintainer names on the command line."""
    from tools.rebase.stack import gitsource

    outside = _git("hash-object", "-w", "--stdin", cwd=fork.upstream, input="not in the pin\n").stdout.strip()
    apply(fork.layout, log=quiet)
    repos = [fork.work / ".git", *(tmp_path / "cache" / "git").glob("*.git")]
    assert len(repos) == 2
    for repo in repos:
        assert not (repo / "objects" / "info" / "alternates").exists(), repo
        assert _git("--git-dir", repo, "cat-file", "-e", outside, cwd=tmp_path).returncode != 0, repo

    url = "https://example.invalid/upstream.git"
    monkeypatch.setattr(gitsource, "MIRRORS", {})
    gitsource.use_mirror(url, fork.upstream)
    gitsource.resolve_git_ref(tmp_path / "cache", url, "v1")
    with gitsource._git_cache(tmp_path / "cache", url) as mirror:
        assert _git("--git-dir", mirror, "cat-file", "-e", outside, cwd=tmp_path).returncode == 0


# ---------------------------------------------------------------- patches/proof.json is data from a PR

@pytest.mark.parametrize("entry, why", [
    ({"verdict": "proven | <img src=x> |\n| evil", "failed": 1, "tests": 1}, "verdict"),
    ({"verdict": "proven", "failed": "1 | x", "tests": 1}, "failed"),
    ({"verdict": "proven"}, "not a count"),
    ({}, "verdict"),
])
def test_proof_record_entries_are_validated_before_they_reach_the_readme(fork, entry, why):
    import json

    from tools.rebase.proof.listing import patch_table
    from tools.rebase.stack.series import load_stack
    from tools.rebase.stack.state import current_digest

    two_patch_stack(fork)
    _, patches = load_stack(fork.layout)
    good = {"verdict": "unproven", "failed": 0, "tests": 1}
    record = {"stack_digest": current_digest(fork.layout, patches),
              "patches": [{"name": "alpha-seven", **good}, {"name": "beta-extra", **entry}]}
    (fork.layout.patches / "proof.json").write_text(json.dumps(record))
    problems = [p for p in check(fork.layout, log=quiet) if "proof.json" in p]
    assert len(problems) == 1, problems
    assert problems[0].startswith("patches/proof.json: ") and "beta-extra" in problems[0] and why in problems[0]
    table = patch_table(fork.layout)
    assert "<img" not in table and "| evil" not in table and "1 | x" not in table
    assert table.count("not recorded") == 2, table


@pytest.mark.parametrize("entry", ["../outside/0002-beta-extra.patch", "{outside}/0002-beta-extra.patch"])
def test_series_entries_outside_patches_are_refused(fork, tmp_path, capsys, entry):
    """The series names files in patches/ only: a path would make apply (git am) take a patch
    file from anywhere on the machine."""
    two_patch_stack(fork)
    tip = rev_parse(fork.work, "HEAD")
    outside = fork.root / "outside"
    outside.mkdir()
    evil = (fork.layout.patches / "0002-beta-extra.patch").read_text().replace("BETA_EXTRA = 'x'", "EVIL = 1")
    (outside / "0002-beta-extra.patch").write_text(evil)
    entry = entry.format(outside=outside)
    fork.layout.series.write_text(fork.layout.series.read_text().replace("0002-beta-extra.patch", entry))
    with pytest.raises(RebaseError, match=r"patches/series:\d+: .* must be a plain name"):
        apply(fork.layout, log=quiet)
    assert rev_parse(fork.work, "HEAD") == tip
    code, _, err = run_cli(capsys, "-C", fork.root, "check")
    assert code != 0 and "patches/series:" in err and "plain name" in err, err


def test_a_malformed_committed_report_is_a_clean_error_when_the_record_is_rebuilt(fork, capsys):
    """A fresh clone rebuilds the last bump from the committed REBASE_REPORT.json, which a pull
    request can change: a row of the wrong shape is an error naming the file, not a traceback."""
    import json

    from tools.rebase.bump.bump import bump
    from tools.rebase.bump.journal import last_bump_dir

    two_patch_stack(fork)
    (fork.root / ".gitignore").write_text(".rebase/\nmegatron/\n")
    init(fork.root, {}, "fork at v1")
    fork.upstream_commit({"README.md": "synthetic upstream v2\n"}, "v2", tag="v2")
    bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, run_tests=False)
    shutil.rmtree(last_bump_dir(fork.layout))
    data = json.loads(fork.layout.report_json.read_text())
    data["mapping"][0].pop("status")
    fork.layout.report_json.write_text(json.dumps(data))
    commit(fork.root, {}, "bump to v2")
    code, _, err = run_cli(capsys, "-C", fork.root, "report")
    assert code == 2 and "REBASE_REPORT.json is not a bump report" in err, err


def test_a_symlinked_resolutions_folder_is_refused_before_anything_is_read_or_pruned(fork, tmp_path):
    """patches/resolutions comes from a pull request: as a link to an outside folder, import would
    read it and the bump's prune would delete every folder in it not named like a patch."""
    from tools.rebase.bump.resolutions import export_resolutions, import_resolutions, prune

    victim = tmp_path / "victim"
    (victim / "keep-me" / ("c" * 40)).mkdir(parents=True)
    (victim / "keep-me" / ("c" * 40) / "preimage").write_text("outside\n")
    fork.layout.patches.mkdir(exist_ok=True)
    os.symlink(victim, fork.layout.resolutions)
    init(fork.work, {"x": "1\n"})
    for call in (lambda: import_resolutions(fork.layout.resolutions, fork.work),
                 lambda: export_resolutions(fork.work, fork.layout.resolutions, "alpha-seven", ["a" * 40]),
                 lambda: prune(fork.layout.resolutions, set())):
        with pytest.raises(RebaseError, match="resolutions: recorded resolutions must not be symlinks"):
            call()
    assert (victim / "keep-me" / ("c" * 40) / "preimage").read_text() == "outside\n"
    assert not (fork.work / ".git" / "rr-cache").exists()


@pytest.mark.parametrize("linked", ["0002-beta-extra.patch", "series"])
def test_a_symlinked_patch_or_series_file_is_refused(fork, tmp_path, linked):
    """A file of patches/ committed as a link would make apply read it from outside the checkout."""
    two_patch_stack(fork)
    tip = rev_parse(fork.work, "HEAD")
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(fork.layout.patches / linked, outside / linked)
    os.symlink(outside / linked, fork.layout.patches / linked)
    with pytest.raises(RebaseError, match=f"patches/{linked}: .*must not be a symlink"):
        apply(fork.layout, log=quiet)
    assert rev_parse(fork.work, "HEAD") == tip
    try:  # a bad series line stops check; a bad patch file is one of its problems
        problems = check(fork.layout, log=quiet)
    except RebaseError as exc:
        problems = [str(exc)]
    assert any(f"patches/{linked}: " in p and "must not be a symlink" in p for p in problems), problems


def test_forecast_copies_patches_without_following_links(fork, tmp_path):
    """The dry run's scratch copy of patches/ keeps a link a link, so the same refusal applies
    (instead of copying the outside folder in as recorded resolutions)."""
    from tools.rebase.bump.forecast import forecast

    two_patch_stack(fork)
    fork.upstream_commit({"README.md": "synthetic upstream v2\n"}, "v2", tag="v2")
    (tmp_path / "victim" / "alpha-seven").mkdir(parents=True)
    os.symlink(tmp_path / "victim", fork.layout.resolutions)
    with pytest.raises(RebaseError, match="resolutions: recorded resolutions must not be symlinks"):
        forecast(fork.layout, f"git:{fork.upstream}@v2")


@pytest.mark.parametrize("minor, why", [("int('42')", "MINOR is not a literal"), ("(", "does not parse")])
def test_a_version_that_is_not_a_literal_is_a_clean_error(fork, minor, why):
    """The version is read from the patched package_info.py (patches are untrusted) without running
    it; anything but literals there is an error naming the file, not a traceback."""
    apply(fork.layout, log=quiet)
    fork.add_patch("computed-version", {"megatron/core/package_info.py":
                                        lambda t: t.replace("MINOR = 42", f"MINOR = {minor}")})
    with pytest.raises(RebaseError, match=rf"package_info.py: {re.escape(why)}"):
        export(fork.layout, log=quiet)


def test_pytest_runners_refuse_a_plugin_option_even_if_validation_is_bypassed(tmp_path):
    """pytest loads ``-p NAME`` even after ``--``: both runners refuse such an id themselves."""
    from tools.rebase.proof import prove
    from tools.rebase.proof.testrun import run_pytest

    run = tmp_path / "run"
    (run / "tests").mkdir(parents=True)
    (run / "tests" / "test_a.py").write_text("def test_ok():\n    assert True\n")
    shutil.copy2(Path(prove.__file__).with_name("prove_report.py"), run / f"{prove._PLUGIN}.py")
    marker = tmp_path / "plugin-ran"
    (run / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    with pytest.raises(RebaseError, match="prove: refusing Tests: id '-pevil': starts with '-'"):
        prove.run_tests(run, ["-pevil", "tests/test_a.py::test_ok"])
    outcomes = run_pytest(run, ["-pevil", "tests/test_a.py::test_ok"])
    assert not marker.exists()
    assert outcomes["tests/test_a.py::test_ok"] == "passed"
    assert outcomes["-pevil"].startswith("refused: starts with '-'")


# ---------------------------------------------------------------- the tool's own paths as committed symlinks

def _tree_digest(path: Path) -> dict:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", ["patches", ".rebase", "megatron", "REBASE_REPORT.md", "upstream.toml"])
def test_a_tool_path_committed_as_a_symlink_is_refused_before_anything_is_written(fork, tmp_path, capsys, name):
    """A PR can commit ``patches`` (or ``.rebase``, ``megatron``, the report, the pin) as a link to a
    folder outside the checkout; writing through it would land there."""
    two_patch_stack(fork)
    (fork.root / "REBASE_REPORT.md").write_text("report\n")
    outside = tmp_path / "outside"
    shutil.move(fork.root / name, outside)
    os.symlink(outside, fork.root / name)
    before = _tree_digest(outside) if outside.is_dir() else outside.read_bytes()
    with pytest.raises(RebaseError, match=rf"{re.escape(name)} must not be symlinks"):
        apply(fork.layout, log=quiet, force=True)
    with pytest.raises(RebaseError, match=rf"{re.escape(name)} must not be symlinks"):
        export(fork.layout, log=quiet)
    code, _, err = run_cli(capsys, "-C", fork.root, "list")
    assert code != 0 and f"{name} must not be symlinks" in err
    assert (_tree_digest(outside) if outside.is_dir() else outside.read_bytes()) == before


def test_prove_copies_links_in_tests_as_links_and_refuses_a_linked_tests_folder(fork, tmp_path):
    from tools.rebase.proof.prove import _prepare_run_dir

    secret = tmp_path / "secret.py"
    secret.write_text("SECRET = 1\n")
    (fork.root / "tests").mkdir(exist_ok=True)
    os.symlink(secret, fork.root / "tests" / "linked.py")
    _prepare_run_dir(fork.layout, tmp_path / "run")
    copied = tmp_path / "run" / "tests" / "linked.py"
    assert copied.is_symlink() and os.readlink(copied) == str(secret)

    shutil.move(fork.root / "tests", tmp_path / "real-tests")
    os.symlink(tmp_path / "real-tests", fork.root / "tests")
    with pytest.raises(RebaseError, match="tests must not be a symlink"):
        _prepare_run_dir(fork.layout, tmp_path / "run2")


def test_prove_record_is_refused_when_the_stack_changed_during_the_run(fork):
    from tools.rebase.proof.prove import Proof
    from tools.rebase.proof.record import PROVEN, proof_path, stack_digest_now, write_record
    from tools.rebase.stack.series import load_stack

    two_patch_stack(fork)
    proved = stack_digest_now(fork.layout)
    proofs = [Proof(p.name, tests=1, failed=1, verdict=PROVEN) for p in load_stack(fork.layout)[1]]
    path = fork.layout.patches / "0002-beta-extra.patch"
    path.write_text(path.read_text().replace("Why it exists.", "Why it exists, edited during the run."))
    with pytest.raises(RebaseError, match="changed while prove ran; nothing was recorded"):
        write_record(fork.layout, proofs, proved)
    assert not proof_path(fork.layout).exists()
    write_record(fork.layout, proofs, stack_digest_now(fork.layout))
    assert proof_path(fork.layout).is_file()


def test_export_that_refuses_a_new_patch_leaves_patches_and_state_as_they_were(fork):
    """The version is read and the new files parsed before patches/ is touched."""
    from tools.rebase.stack.state import read_state

    two_patch_stack(fork)
    before, state = fork.patch_files(), read_state(fork.layout)
    fork.add_patch("computed-version", {"megatron/core/package_info.py":
                                        lambda t: t.replace("MINOR = 42", "MINOR = int('42')")})
    with pytest.raises(RebaseError, match="package_info.py: MINOR is not a literal"):
        export(fork.layout, log=quiet)
    assert fork.patch_files() == before
    assert read_state(fork.layout) == state
    assert not list(fork.layout.state_dir.glob("export-*"))


# ---------------------------------------------------------------- relative local paths

def test_a_pin_with_a_relative_local_path_is_refused_and_onto_resolves_one_where_it_was_typed(
        fork, tmp_path, monkeypatch):
    from tools.rebase.stack.pin import load_pin, parse_spec

    text = fork.layout.pin.read_text()
    url = re.search(r'url = "([^"]+)"', text)[1]
    fork.layout.pin.write_text(text.replace(url, "../upstream"))
    with pytest.raises(RebaseError, match=r"upstream.toml: url '../upstream' is a relative local path"):
        load_pin(fork.layout.pin)
    fork.layout.pin.write_text(text.replace(url, "git@example.invalid:upstream.git"))
    assert load_pin(fork.layout.pin).url == "git@example.invalid:upstream.git"

    monkeypatch.chdir(tmp_path)
    assert parse_spec("git:some/repo@v2") == ("git", str(tmp_path / "some" / "repo"), "v2")
    assert parse_spec("git:https://example.invalid/x.git@v2")[1] == "https://example.invalid/x.git"
