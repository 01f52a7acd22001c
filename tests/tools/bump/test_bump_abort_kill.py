"""Issue 46, item 10: a kill at any point inside ``bump --abort`` leaves a checkout the tool still
finds, and the next ``bump --abort`` restores everything exactly. Each run kills the abort at the
n-th rename or removal it makes (an audit hook sees each)."""

import os
import subprocess
import sys

import pytest

from tests.tools.bump.test_bump import STACK, bump_stops, upstream_v2
from tests.tools.bumpkit import make_fork
from tests.tools.hostile import REPO_ROOT

KILL = """
import os, sys
sys.path.insert(0, {repo!r})
count = [0]
def hook(event, args):
    if event in ("os.rename", "os.remove", "os.rmdir", "shutil.rmtree", "os.unlink"):
        count[0] += 1
        if count[0] == {n}:
            os._exit(9)
sys.addaudithook(hook)
import tools.rebase.bump.journal as journal
if {no_exchange}:  # a file system without renameat2(RENAME_EXCHANGE): the rename-aside fallback
    journal.exchange = lambda a, b: False
from tools.rebase.cli import main
sys.exit(main(["-C", {root!r}, "bump", "--abort"]))
"""


@pytest.mark.parametrize("no_exchange", [False, True])
@pytest.mark.parametrize("n", range(1, 40, 3))
def test_a_kill_inside_abort_leaves_a_checkout_the_next_abort_restores(tmp_path, monkeypatch, n, no_exchange):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    upstream_v2(fork, conflict=True)
    before = fork.snapshot()[0]
    bump_stops(fork)
    proc = subprocess.run([sys.executable, "-c", KILL.format(repo=str(REPO_ROOT), n=n, root=str(fork.root), no_exchange=no_exchange)],
                          capture_output=True, text=True, env=dict(os.environ))
    journal = fork.root / ".rebase" / "bump" / "journal.json"
    if proc.returncode == 9 and journal.exists():  # killed: the tool must find the checkout and finish
        again = subprocess.run([sys.executable, "-m", "tools.rebase", "-C", str(fork.root), "bump", "--abort"],
                               cwd=REPO_ROOT, capture_output=True, text=True)
        assert again.returncode == 0, again.stderr
    else:  # finished, or killed once the journal (removed last but the backup) was gone
        assert proc.returncode in (0, 9), proc.stderr
    assert fork.snapshot()[0] == before
    assert not journal.exists()
