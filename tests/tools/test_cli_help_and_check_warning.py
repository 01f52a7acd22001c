"""Subcommand help says what a command does, writes and costs; check warns about unexported work."""

import subprocess
import sys
from pathlib import Path

import pytest

from tools.rebase.proof.check import check
from tools.rebase.cli import build_parser
from tools.rebase.stack.workrepo import apply, export

ROOT = Path(__file__).resolve().parents[2]


def quiet(*_args, **_kwargs):
    pass


def subcommands():
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_subcommand_help_says_what_it_writes_and_how_long_it_takes(name):
    proc = subprocess.run([sys.executable, "-m", "tools.rebase", name, "--help"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "Writes:" in text, text
    assert "Takes:" in text, text
    # Man-page layout: examples of this very subcommand, and where to read more.
    examples = proc.stdout.split("Examples:\n", 1)[1].split("\n\nSee also:", 1)[0]
    assert f"  python -m tools.rebase {name}" in examples, proc.stdout
    assert "See also: docs/editing-a-patch.md" in text


def test_check_warns_about_commits_never_exported(fork):
    apply(fork.layout, log=quiet)
    fork.add_patch("alpha-seven", {"megatron/core/alpha.py": lambda t: t.replace("return 7", "return 70")})
    export(fork.layout, log=quiet)
    lines = []
    assert check(fork.layout, log=lines.append) == []
    assert not any("never exported" in line for line in lines)

    fork.add_patch("beta-extra", {"megatron/core/beta.py": lambda t: t + "BETA_EXTRA = 1\n"},
                   subject="beta: an extra constant")
    lines = []
    check(fork.layout, log=lines.append)
    warning = [line for line in lines if "never exported" in line]
    assert len(warning) == 1, lines
    assert "1 commit(s)" in warning[0] and "beta: an extra constant" in warning[0]
