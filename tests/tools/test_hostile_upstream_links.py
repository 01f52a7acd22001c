"""Issue 46, Low (guard only): a hostile upstream (a git pin a maintainer allowed) whose
``megatron/core/package_info.py`` is a link to a file outside is not read through by ``apply``;
``upstream_version`` reads only a regular file. (``apply`` refused the link before this change
too; the bump path the issue names is not covered here.)"""

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
