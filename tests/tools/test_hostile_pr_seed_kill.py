"""Issue 46, Low: a kill during ``seed --line NAME`` left a half-seeded line (some patch files the
release line's, the rest the line's) that the next ``seed`` refused as hand edits. The next
``seed`` now finishes the killed one: it keeps the backup the killed run made of the line's own
files and writes the release line's again."""

import os
import subprocess
import sys

from tests.tools.bumpkit import (add_line, commit_checkout, ignore_generated, make_fork, replace_line)
from tests.tools.hostile import REPO_ROOT, STACK, pull_request, tool

A = "megatron/core/alpha.py"

# Kills the seed when it renames its n-th patch file into the line's patches/ (the audit hook runs
# before the rename it reports).
KILL_SCRIPT = """
import os, sys
sys.path.insert(0, {repo!r})
count = [0]
def hook(event, args):
    if event == "os.rename" and os.fspath(args[1]).startswith({patches!r}) and os.fspath(args[1]).endswith(".patch"):
        count[0] += 1
        if count[0] == {n}:
            os._exit(9)
sys.addaudithook(hook)
from tools.rebase.cli import main
sys.exit(main(["-C", {root!r}, "seed", "--line", "next"]))
"""


def test_a_seed_killed_midway_is_finished_by_the_next_seed(tmp_path):
    fork = make_fork(tmp_path)
    fork.stack(STACK)
    line = add_line(fork, "next")
    line.stack([("keep-alpha", {A: replace_line("alpha line 10\n", "alpha line 10 on the line\n")})])
    ignore_generated(fork)
    commit_checkout(fork, "release line and a line")
    ci = pull_request(fork, tmp_path, lambda pr: None)
    cache = tmp_path / "cache"
    assert tool(ci, "apply", "--line", "next", cache=cache).returncode == 0
    home = ci / "lines" / "next"
    own = {p.name: p.read_bytes() for p in (home / "patches").glob("*.patch")}
    own_pin = (home / "upstream.toml").read_bytes()
    env = dict(os.environ, FORK_REBASE_CACHE=str(cache))
    script = KILL_SCRIPT.format(repo=str(REPO_ROOT), n=2, root=str(ci), patches=str(home / "patches"))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr
    release = {p.name: p.read_bytes() for p in (ci / "patches").glob("*.patch")}
    now = {p.name: p.read_bytes() for p in (home / "patches").glob("*.patch")}
    assert now != release and now != own  # half-seeded

    proc = tool(ci, "seed", "--line", "next", cache=cache)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {p.name: p.read_bytes() for p in (home / "patches").glob("*.patch")} == release
    assert (home / "patches" / "series").read_bytes() == (ci / "patches" / "series").read_bytes()
    assert (home / "upstream.toml").read_bytes() == (ci / "upstream.toml").read_bytes()
    backup = ci / ".rebase" / "lines" / "next" / "seed-backup"  # the line's own files, not the half-seeded ones
    assert {p.name: p.read_bytes() for p in backup.glob("*.patch")} == own
    assert (backup / "upstream.toml").read_bytes() == own_pin
