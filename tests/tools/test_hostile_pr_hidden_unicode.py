"""Issue 56, item 8: bidirectional-override and invisible Unicode controls in a patch's added lines
("Trojan Source": the line a reviewer sees is not the line Python runs) fail ``check``, which names
the patch, its line, the file and line it adds to, and the character."""

import pytest

from tests.tools.bumpkit import replace_line
from tests.tools.hostile import STACK, committed_fork, tool

A = "megatron/core/alpha.py"
CASES = {
    "rlo": ('access = "user\u202e \u2066# admin\u2069 \u2066"\n', "U+202E RIGHT-TO-LEFT OVERRIDE"),
    "zwsp": ("is_admin\u200b = True\n", "U+200B ZERO WIDTH SPACE"),
    "line-separator": ("x = 1  # done\u2028y = 2\n", "U+2028 LINE SEPARATOR"),
    "bom-mid-line": ("z\ufeff = 3\n", "U+FEFF ZERO WIDTH NO-BREAK SPACE"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hidden_control_in_an_added_line_fails_check_by_name(tmp_path, case):
    line, named = CASES[case]
    fork = committed_fork(tmp_path, stack=STACK + [("hidden", {A: replace_line("alpha line 20\n",
                                                                                 "alpha line 20\n" + line)})])
    patch = (fork.layout.patches / "0003-hidden.patch").read_text()
    patch_line = patch.split("\n").index("+" + line.rstrip("\n")) + 1
    proc = tool(fork.root, "check", cache=tmp_path / "cache")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert f"patches/0003-hidden.patch:{patch_line}: the line it adds to {A}:21 holds {named}" in proc.stderr, \
        proc.stderr


def test_plain_unicode_in_added_lines_passes(tmp_path):
    line = 'greeting = "h\u00e9llo \u4e16\u754c \u05e9\u05dc\u05d5\u05dd"\n'  # accents, CJK, Hebrew: no controls
    fork = committed_fork(tmp_path, stack=STACK + [("plain", {A: replace_line("alpha line 20\n",
                                                                                "alpha line 20\n" + line)})])
    proc = tool(fork.root, "check", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_hidden_control_in_a_file_name_fails_check_by_name(tmp_path):
    name = "megatron/core/util\u202eyp.py"  # shows as "utilpy.py"-like text, reversed
    fork = committed_fork(tmp_path, stack=STACK + [("named", {name: "x = 1\n"})])
    proc = tool(fork.root, "check", cache=tmp_path / "cache")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "patches/0003-named.patch: it changes the file" in proc.stderr and "U+202E" in proc.stderr, proc.stderr
