"""Issue 22, items 3 and 8: a pull request that changes the pin cannot make the tool run code from
an sdist (no pip download, no build step; the package must be megatron-core), and the archive
that is extracted is the one whose hash was checked."""

import os
import tarfile
from pathlib import Path

import pytest

from tests.tools.bumpkit import sh
from tests.tools.hostile import committed_fork, pull_request, tool
from tests.tools.sdists import pinned_to_sdist, write_sdist


def booby_trapped_sdist(folder: Path, marker: Path, minor: int = 0, name="evilcore", mtime=1_700_000_000) -> tuple:
    """``name``-1.0.tar.gz whose setup.py and in-tree build backend write ``marker`` when run."""
    trap = f"open({str(marker)!r}, 'a').write('ran\\n')\n"
    files = {
        "setup.py": trap + "from setuptools import setup\nsetup(name='evilcore', version='1.0')\n",
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
        "backend.py": trap + "def prepare_metadata_for_build_wheel(d, config_settings=None):\n    raise SystemExit(1)\n",
        "PKG-INFO": "Metadata-Version: 2.1\nName: evilcore\nVersion: 1.0\n",
        "megatron/core/__init__.py": "",
        "megatron/core/package_info.py": f"MAJOR = 1\nMINOR = {minor}\nPATCH = 0\nPRE_RELEASE = ''\n",
    }
    path = folder / f"{name}-1.0.tar.gz"
    return path, write_sdist(path, f"{name}-1.0", files, mtime)


def _pin_payload(sha256: str, package="evilcore"):
    return pinned_to_sdist(package, "1.0", sha256)


def test_a_pin_naming_another_package_is_refused_and_its_sdist_never_runs(tmp_path, find_links):
    marker = tmp_path / "SDIST-CODE-RAN"
    _, sha = booby_trapped_sdist(find_links, marker)
    ci = pull_request(committed_fork(tmp_path), tmp_path, _pin_payload(sha))
    for command in ("check", "apply"):
        proc = tool(ci, command, cache=tmp_path / "cache")
        assert proc.returncode != 0
        assert "package 'evilcore' is not 'megatron-core'" in proc.stderr and "upstream.toml" in proc.stderr, \
            proc.stderr
    assert not marker.exists()
    assert not list((tmp_path / "cache").rglob("*.tar.gz"))


def test_an_sdist_a_maintainer_allows_is_fetched_and_applied_without_running_any_of_it(tmp_path, find_links):
    marker = tmp_path / "SDIST-CODE-RAN"
    _, sha = booby_trapped_sdist(find_links, marker, minor=7)
    ci = pull_request(committed_fork(tmp_path), tmp_path, _pin_payload(sha))
    proc = tool(ci, "apply", cache=tmp_path / "cache", env={"FORK_REBASE_ALLOW_PACKAGE": "evilcore"})
    assert proc.returncode == 0, proc.stderr
    assert "MINOR = 7" in (ci / "megatron" / "core" / "package_info.py").read_text()
    assert (tmp_path / "cache" / "sdist" / "evilcore-1.0.tar.gz").is_file()
    assert not marker.exists(), "the sdist's build code ran"


def test_the_hash_an_index_page_serves_is_taken_for_a_bump_and_a_wrong_one_is_refused(tmp_path, find_links,
                                                                                       monkeypatch):
    from tools.rebase.errors import RebaseError
    from tools.rebase.stack.source import download_sdist, sha256_file

    marker = tmp_path / "SDIST-CODE-RAN"
    served = tmp_path / "served"
    path, sha = booby_trapped_sdist(served, marker)
    page = served / "index.html"
    monkeypatch.setenv("PIP_FIND_LINKS", page.as_uri())
    page.write_text(f'<html><body><a href="evilcore-1.0.tar.gz#sha256={sha}">evilcore-1.0.tar.gz</a></body></html>\n')
    got = download_sdist(tmp_path / "cache", "evilcore", "1.0", "", log=lambda _m: None)  # bump --onto pypi:
    assert sha256_file(got) == sha
    got.unlink()
    page.write_text(f'<a href="evilcore-1.0.tar.gz#sha256={"0" * 64}">evilcore-1.0.tar.gz</a>\n')
    with pytest.raises(RebaseError, match=f"has sha256 {sha}, not the expected {'0' * 64}"):
        download_sdist(tmp_path / "cache", "evilcore", "1.0", "", log=lambda _m: None)
    assert not list((tmp_path / "cache").rglob("*.tar.gz")) and not list((tmp_path / "cache").rglob("*.part"))
    assert not marker.exists()


def test_the_extracted_archive_is_the_hashed_one_even_if_the_cache_file_is_swapped(tmp_path, monkeypatch):
    from tools.rebase.stack import source
    from tools.rebase.stack.pin import Pin

    cache = tmp_path / "cache"
    monkeypatch.setenv("FORK_REBASE_CACHE", str(cache))  # pre-seeded: the machine's cache
    _, sha = booby_trapped_sdist(cache / "sdist", tmp_path / "M", minor=1)
    swapped, _ = booby_trapped_sdist(tmp_path / "evil", tmp_path / "M", minor=66)
    real_open = tarfile.open

    def swap_then_open(*args, **kwargs):  # another process replaces the file after the hash check
        os.replace(swapped, cache / "sdist" / "evilcore-1.0.tar.gz")
        return real_open(*args, **kwargs)

    monkeypatch.setattr(source.tarfile, "open", swap_then_open)
    work = tmp_path / "work"
    base = source.import_base(work, cache, Pin("pypi", package="evilcore", version="1.0", sha256=sha))
    assert "MINOR = 1\n" in sh("git", "show", f"{base}:megatron/core/package_info.py", cwd=work)


def test_an_sdist_dated_past_what_git_can_store_is_a_clean_error(tmp_path, monkeypatch):
    from tools.rebase.stack import source
    from tools.rebase.errors import RebaseError
    from tools.rebase.stack.pin import Pin

    cache = tmp_path / "cache"
    monkeypatch.setenv("FORK_REBASE_CACHE", str(cache))  # pre-seeded: the machine's cache
    _, sha = booby_trapped_sdist(cache / "sdist", tmp_path / "M", mtime=2 ** 40)
    with pytest.raises(RebaseError, match=r"evilcore-1.0.tar.gz: a member's mtime \(1099511627776\) is after"):
        source.import_base(tmp_path / "work", cache, Pin("pypi", package="evilcore", version="1.0", sha256=sha))


@pytest.mark.parametrize("rel, data, message", [
    ("upstream.toml", b'[upstream]\nkind = "git"\n# \xff\xfe\n', "upstream.toml: not UTF-8"),
    ("upstream.toml", b"x = " + b"[" * 100_000 + b"\n", "upstream.toml: not valid TOML"),
    ("patches/series", b"0001-keep-alpha.patch\n\xff\n", "series: not UTF-8"),
])
def test_a_pin_or_series_that_is_not_utf8_or_nested_too_deeply_is_a_clean_error(tmp_path, rel, data, message):
    ci = pull_request(committed_fork(tmp_path), tmp_path, lambda pr: (pr / rel).write_bytes(data))
    proc = tool(ci, "check", cache=tmp_path / "cache")
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_git_pin_naming_another_repository_is_refused_and_nothing_is_fetched(tmp_path, where):
    """Issue 46, item 8: a committed git pin names the upstream repository only; another needs the
    maintainer's FORK_REBASE_ALLOW_GIT_URL (the tests' own allow pytest's temporary folder)."""
    evil = tmp_path / "evil"
    evil.mkdir()
    sh("git", "init", "-q", "-b", "main", cwd=evil)
    (evil / "megatron" / "core").mkdir(parents=True)
    (evil / "megatron" / "core" / "package_info.py").write_text("MAJOR = 9\nMINOR = 9\nPATCH = 9\n")
    sh("git", "add", "-A", cwd=evil)
    sh("git", "commit", "-q", "-m", "evil", cwd=evil)
    commit = sh("git", "rev-parse", "HEAD", cwd=evil).strip()
    url = str(evil) if where == "local" else "https://evil.invalid/megatron.git"

    def payload(pr):
        (pr / "upstream.toml").write_text(f'[upstream]\nkind = "git"\nurl = "{url}"\ncommit = "{commit}"\n')
        for patch in (pr / "patches").glob("*.patch"):
            patch.unlink()
        (pr / "patches" / "series").write_text("# no patches\n")

    ci = pull_request(committed_fork(tmp_path), tmp_path, payload)
    strict = {"FORK_REBASE_ALLOW_GIT_URL": ""}
    for command in ("check", "apply"):
        proc = tool(ci, command, cache=tmp_path / "cache", env=strict)
        assert proc.returncode != 0
        assert "is not the upstream repository" in proc.stderr and url in proc.stderr, proc.stderr
        assert "FORK_REBASE_ALLOW_GIT_URL" in proc.stderr
    assert not (ci / "megatron").exists()
    assert not list((tmp_path / "cache").rglob("package_info.py")) if (tmp_path / "cache").exists() else True
    proc = tool(ci, "apply", cache=tmp_path / "cache", env={"FORK_REBASE_ALLOW_GIT_URL": str(evil)})
    assert (proc.returncode == 0) == (where == "local"), proc.stderr  # the maintainer's flag allows it
