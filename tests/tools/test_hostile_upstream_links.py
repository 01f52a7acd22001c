"""Issue 46, Low: a hostile upstream (a git pin a maintainer allowed) whose ``megatron/`` holds
links: ``megatron/core/package_info.py`` linked to a file outside is not read through by
``apply``, and a bump refuses a new base with a link under ``megatron/`` before it changes
anything (``import_base`` takes regular files only there, as sdist extraction does)."""

import os

from tests.tools.bumpkit import UPSTREAM_FILES, init, make_fork, sh
from tests.tools.hostile import tool


def test_a_linked_package_info_in_the_upstream_is_refused_not_read_through(tmp_path):
    outside = tmp_path / "outside.py"
    outside.write_text("MAJOR = 77\nMINOR = 7\nPATCH = 7\nPRE_RELEASE = ''\n")
    upstream = tmp_path / "upstream"
    files = {k: v for k, v in UPSTREAM_FILES.items() if not k.endswith("package_info.py")}
    init(upstream, files, "upstream v1")
    os.symlink(outside, upstream / "megatron" / "core" / "package_info.py")
    sh("git", "add", "-A", cwd=upstream)
    sh("git", "commit", "-q", "-m", "linked version", cwd=upstream)
    sh("git", "tag", "v1", cwd=upstream)
    fork = make_fork(tmp_path)
    proc = tool(fork.root, "apply", cache=tmp_path / "cache")
    assert proc.returncode != 0
    assert "package_info.py" in proc.stderr and "symlink" in proc.stderr, proc.stderr
    assert "77.7.7" not in proc.stdout + proc.stderr
    assert not (fork.root / "megatron").exists()


def test_a_bump_refuses_a_base_with_links_under_megatron(tmp_path):
    """A hostile upstream's new base holds ``megatron/core/linked.py``, a link to a file outside:
    the bump refuses the base, naming the link, and the checkout keeps its pin and patches."""
    from tests.tools.hostile import committed_fork, pull_request

    outside = tmp_path / "outside.py"
    outside.write_text("SECRET = 1\n")
    fork = committed_fork(tmp_path)
    os.symlink(outside, fork.upstream / "megatron" / "core" / "linked.py")
    sh("git", "add", "-A", cwd=fork.upstream)
    sh("git", "commit", "-q", "-m", "upstream: a link", cwd=fork.upstream)
    sh("git", "tag", "v2", cwd=fork.upstream)
    ci = pull_request(fork, tmp_path, lambda pr: None)
    before = {p.name: p.read_bytes() for p in (ci / "patches").iterdir() if p.is_file()}
    pin = (ci / "upstream.toml").read_bytes()
    proc = tool(ci, "bump", "--onto", f"git:{fork.upstream}@v2", cache=tmp_path / "cache")
    assert proc.returncode != 0
    assert "megatron/core/linked.py" in proc.stderr and "symlink" in proc.stderr, proc.stderr
    assert (ci / "upstream.toml").read_bytes() == pin
    assert {p.name: p.read_bytes() for p in (ci / "patches").iterdir() if p.is_file()} == before
