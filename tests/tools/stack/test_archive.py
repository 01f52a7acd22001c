"""A git pin's tree from upstream's archive of the commit, checked against the pin's
``tree_sha256`` (issue 58, item 1): the same base commit a mirror gives, and nothing used or
cached from an archive whose tree differs."""

import io

import pytest

from tests.tools.bumpkit import sh
from tests.tools.linekit import fork_with_dev_line, git_archive, packaged_upstream, retarred
from tools.rebase.cli import main
from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import rev_parse
from tools.rebase.stack.archive import ARCHIVE_URL_ENV, archive_entries, commit_tree_digest, digest_of, write_tree
from tools.rebase.stack.pin import load_pin

REMOTE = "https://example.invalid/upstream.git"  # allowed by the tests' conftest; never reachable


def test_a_commits_digest_is_its_archives_and_the_archive_imports_as_the_same_tree(tmp_path):
    upstream, v1, dev = packaged_upstream(tmp_path)
    entries, newest = archive_entries(io.BytesIO(git_archive(upstream, dev)), "archive", dev)
    assert digest_of(entries) == commit_tree_digest(upstream, dev)
    modes = {path: mode for path, mode, _ in entries}
    assert modes["tools/run.sh"] == "100755" and modes["docs/link.md"] == "120000"
    assert newest == int(sh("git", "show", "-s", "--format=%ct", dev, cwd=upstream))
    repo = tmp_path / "empty"
    sh("git", "init", "-q", str(repo), cwd=tmp_path)
    assert write_tree(repo, entries) == sh("git", "rev-parse", f"{dev}^{{tree}}", cwd=upstream).strip()
    # One byte changed, or a file added, changes the digest.
    changed = retarred(git_archive(upstream, dev), lambda name, data: data + b"#" if name.endswith("beta.py") else data)
    assert digest_of(archive_entries(io.BytesIO(changed), "x", dev)[0]) != digest_of(entries)
    with pytest.raises(RebaseError, match=f"of commit {dev}, not the pinned {v1}"):
        archive_entries(io.BytesIO(git_archive(upstream, dev)), "archive", v1)


def remote_line(tmp_path, monkeypatch):
    """The fork's line ``dev`` pinned to the upstream commit by a URL this machine cannot reach,
    with its tree digest; the commit's archive served from a local folder."""
    from tools.rebase.stack import gitsource

    monkeypatch.setattr(gitsource, "MIRRORS", {})  # --mirror is remembered per process: not another test's
    # The pin's URL is unreachable, so its branches cannot anchor the commit: a rehearsal's setting.
    monkeypatch.setenv("FORK_REBASE_ALLOW_UNANCHORED_PIN", "1")
    fork, line, dev = fork_with_dev_line(tmp_path)
    digest = commit_tree_digest(fork.upstream, dev)
    line.layout.pin.write_text(f'[upstream]\nkind = "git"\nurl = "{REMOTE}"\ncommit = "{dev}"\n'
                               f'tree_sha256 = "{digest}"\n')
    served = tmp_path / "served"
    served.mkdir()
    (served / f"{dev}.tar.gz").write_bytes(git_archive(fork.upstream, dev))
    monkeypatch.setenv(ARCHIVE_URL_ENV, f"file://{served}/{{commit}}.tar.gz")
    sh("rm", "-rf", str(line.work), cwd=tmp_path)  # another machine: no upstream objects at hand
    return fork, line, dev, served


def test_apply_from_the_archive_gives_the_base_a_mirror_gives(tmp_path, cache, monkeypatch, capsys):
    fork, line, dev, served = remote_line(tmp_path, monkeypatch)
    assert main(["-C", str(fork.root), "apply", "--line", "dev", "--from-archive", "--force"]) == 0
    assert "beta line 5 dev" in (fork.root / "megatron" / "core" / "beta.py").read_text()
    assert "gamma dev" in (fork.root / "megatron" / "core" / "gamma.py").read_text()
    from_archive = sh("git", "rev-parse", "patched", cwd=line.work).strip()
    assert "downloading upstream's archive" in capsys.readouterr().err
    assert not rev_parse(line.work, dev)  # no upstream history was fetched
    # Cached: the served copy is gone and it applies again (a fresh work repo), offline.
    (served / f"{dev}.tar.gz").unlink()
    sh("rm", "-rf", str(line.work), cwd=tmp_path)
    assert main(["-C", str(fork.root), "apply", "--line", "dev", "--from-archive", "--force"]) == 0
    assert sh("git", "rev-parse", "patched", cwd=line.work).strip() == from_archive
    # From a local clone of upstream (--mirror): the same base commit, so the same patch commits.
    sh("rm", "-rf", str(line.work), cwd=tmp_path)
    assert main(["-C", str(fork.root), "apply", "--line", "dev", "--force", "--mirror", str(fork.upstream)]) == 0
    assert rev_parse(line.work, dev)
    assert sh("git", "rev-parse", "patched", cwd=line.work).strip() == from_archive


def test_an_archive_whose_tree_differs_is_refused_and_not_cached(tmp_path, cache, monkeypatch, capsys):
    fork, line, dev, served = remote_line(tmp_path, monkeypatch)
    archive = served / f"{dev}.tar.gz"
    archive.write_bytes(retarred(archive.read_bytes(),
                                 lambda name, data: data + b"import os\n" if name.endswith("alpha.py") else data))
    assert main(["-C", str(fork.root), "apply", "--line", "dev", "--from-archive", "--force"]) == 2
    err = capsys.readouterr().err
    assert "tree digest is" in err and load_pin(line.layout.pin).tree_sha256 in err
    assert not list((cache / "archive").glob("*.tar.gz"))
    assert "import os" not in (fork.root / "megatron" / "core" / "alpha.py").read_text()


def test_without_a_digest_the_archive_is_not_taken(tmp_path, cache, monkeypatch, capsys):
    fork, line, dev, served = remote_line(tmp_path, monkeypatch)
    line.layout.pin.write_text(f'[upstream]\nkind = "git"\nurl = "{REMOTE}"\ncommit = "{dev}"\n')
    assert main(["-C", str(fork.root), "apply", "--line", "dev", "--from-archive", "--force"]) == 2
    assert "records no tree_sha256" in capsys.readouterr().err
    line.layout.pin.write_text(f'[upstream]\nkind = "git"\nurl = "{REMOTE}"\ncommit = "{dev}"\ntree_sha256 = "x1"\n')
    assert main(["-C", str(fork.root), "apply", "--line", "dev", "--from-archive", "--force"]) == 2
    assert "tree_sha256 must be a string of 64 lowercase hex digits" in capsys.readouterr().err


def test_the_default_archive_is_githubs_of_the_pinned_repository(monkeypatch):
    from tools.rebase.stack.archive import archive_url
    from tools.rebase.stack.pin import Pin

    monkeypatch.delenv(ARCHIVE_URL_ENV, raising=False)
    pin = Pin("git", url="https://github.com/NVIDIA/Megatron-LM.git", commit="d" * 40)
    assert archive_url(pin) == f"https://codeload.github.com/NVIDIA/Megatron-LM/tar.gz/{'d' * 40}"
    with pytest.raises(RebaseError, match="no archive URL is known"):
        archive_url(Pin("git", url="/some/path", commit="d" * 40))


def test_the_tree_digest_line_leaves_the_stack_digest_as_it_was():
    """Recording a commit's tree digest changes nothing apply builds: proof records and the version
    label stay current (the line's committed proof.json keeps matching); the commit still counts."""
    from tools.rebase.stack.stack import stack_digest

    pin = b'[upstream]\nkind = "git"\nurl = "https://github.com/NVIDIA/Megatron-LM.git"\ncommit = "' + b"a" * 40 + b'"\n'
    with_digest = pin + b'tree_sha256 = "' + b"0" * 64 + b'"\n'
    other_commit = pin.replace(b"a" * 40, b"b" * 40)
    assert stack_digest(with_digest, b"s", [b"p"]) == stack_digest(pin, b"s", [b"p"])
    assert stack_digest(other_commit, b"s", [b"p"]) != stack_digest(pin, b"s", [b"p"])
