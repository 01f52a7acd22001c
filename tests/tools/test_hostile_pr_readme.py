"""Issue 46, item 9 and a Low item: README.md is data. Patch-table markers out of order or
duplicated are refused (replacing the table would delete the text after it), and a README.md
committed as a link is neither read nor written through."""

import os

import pytest

from tests.tools.hostile import committed_fork, pull_request, tool
from tools.rebase.proof.listing import BEGIN, END

TEXT = "# fork\n\nintro\n\n{a}\nold table\n{b}\n\nprecious text after the table\n"
BAD = {
    "end above begin": TEXT.format(a=END, b=BEGIN),
    "begin twice": TEXT.format(a=BEGIN, b=END) + BEGIN + "\nmore\n",
    "end twice": TEXT.format(a=BEGIN, b=END) + END + "\n",
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_markers_out_of_order_or_duplicated_are_refused_and_the_readme_kept(tmp_path, case):
    fork = committed_fork(tmp_path)
    ci = pull_request(fork, tmp_path, lambda pr: (pr / "README.md").write_text(BAD[case]))
    proc = tool(ci, "list", "--update-readme", cache=tmp_path / "cache")
    assert proc.returncode != 0 and "patch-table" in proc.stderr and "README.md" in proc.stderr, proc.stderr
    assert (ci / "README.md").read_text() == BAD[case]
    proc = tool(ci, "check", cache=tmp_path / "cache")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "patch-table" in out and "list --update-readme" not in out, out


def test_a_readme_committed_as_a_link_is_not_read_or_written_through(tmp_path):
    fork = committed_fork(tmp_path)
    victim = tmp_path / "victim.md"
    victim.write_text(TEXT.format(a=BEGIN, b=END))

    def payload(pr):
        (pr / "README.md").unlink(missing_ok=True)
        os.symlink(victim, pr / "README.md")

    ci = pull_request(fork, tmp_path, payload)
    proc = tool(ci, "list", "--update-readme", cache=tmp_path / "cache")
    assert proc.returncode != 0 and "symlink" in proc.stderr, proc.stderr
    assert victim.read_text() == TEXT.format(a=BEGIN, b=END)
    proc = tool(ci, "check", cache=tmp_path / "cache")
    assert proc.returncode != 0 and "symlink" in proc.stdout + proc.stderr
    assert victim.read_text() == TEXT.format(a=BEGIN, b=END)
