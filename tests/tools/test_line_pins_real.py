"""The git lines' recorded ``tree_sha256`` is the tree digest of their pinned commit, computed from
the local clone of upstream Megatron-LM (``FORK_REBASE_MIRROR``, or the default path on the
maintainers' machine); skipped where there is none. A wrong digest would make every build of the
line without a mirror refuse upstream's archive."""

import os
from pathlib import Path

import pytest

from tools.rebase.git.gitcmd import rev_parse
from tools.rebase.stack.archive import commit_tree_digest
from tools.rebase.stack.pin import load_pin

ROOT = Path(__file__).resolve().parents[2]
MIRROR = Path(os.environ.get("FORK_REBASE_MIRROR", "/work/.mirror/NVIDIA+Megatron-LM/repo"))


@pytest.mark.slow
@pytest.mark.parametrize("line", sorted(p.name for p in (ROOT / "lines").iterdir() if (p / "upstream.toml").is_file()))
def test_a_lines_tree_digest_is_its_commits(line):
    pin = load_pin(ROOT / "lines" / line / "upstream.toml")
    if pin.kind != "git":
        pytest.skip(f"{line} is not pinned to a git commit")
    if not MIRROR.is_dir() or not rev_parse(MIRROR, pin.commit):
        pytest.skip(f"no local clone of upstream holding {pin.commit} (set FORK_REBASE_MIRROR)")
    assert pin.tree_sha256, f"lines/{line}/upstream.toml records no tree_sha256"
    assert commit_tree_digest(MIRROR, pin.commit) == pin.tree_sha256
