"""Issue 56, item 1: a committed ``.gitattributes`` (at any level) that makes the working-tree
bytes of a tool input differ from its committed blob makes every command refuse, naming the file.

The attack: the blob of a new patch holds a line of kanji (what a reviewer reads), and
``working-tree-encoding=ISO-2022-JP`` makes git write it on checkout as ASCII Python that assigns
``pwned``; the old ``check`` compared the fresh export with the converted file and passed, and
``apply`` wrote the payload into ``megatron/``."""

import pytest

from tests.tools.bumpkit import replace_line, sh
from tests.tools.hostile import STACK, committed_fork, pull_request, tool

A = "megatron/core/alpha.py"
# ESC $ B ... ESC ( B: the bytes between read as JIS X 0208 pairs in the blob (kanji), as ASCII on disk.
PAYLOAD = 'X = "\x1b$B";pwned=1#\x1b(B"\n'
EVIL = ("evil", {A: replace_line("alpha line 20\n", "alpha line 20\n" + PAYLOAD)})


def _evil_patch(tmp_path) -> bytes:
    """The exported patch that adds ``PAYLOAD`` (made in a separate fork, as an attacker would)."""
    source = committed_fork(tmp_path / "attacker", stack=STACK + [EVIL])
    return (source.layout.patches / "0003-evil.patch").read_bytes()


def _adds_evil_patch(evil: bytes, attributes_at: str):
    def payload(pr):
        (pr / "patches" / "0003-evil.patch").write_bytes(evil)  # git add stores it converted: kanji
        with open(pr / "patches" / "series", "a") as fh:
            fh.write("0003-evil.patch\n")
        where = pr / attributes_at
        pattern = "0003-evil.patch" if attributes_at == "patches/.gitattributes" else "patches/0003-evil.patch"
        where.write_text(f"{pattern} working-tree-encoding=ISO-2022-JP\n")
    return payload


@pytest.mark.parametrize("attributes_at", [".gitattributes", "patches/.gitattributes"])
def test_a_patch_whose_checkout_bytes_are_not_its_blob_is_refused(tmp_path, attributes_at):
    evil = _evil_patch(tmp_path)
    assert b"pwned" in evil
    fork = committed_fork(tmp_path)
    ci = pull_request(fork, tmp_path, _adds_evil_patch(evil, attributes_at))
    blob = sh("git", "cat-file", "-p", "HEAD:patches/0003-evil.patch", cwd=ci)
    assert "pwned" not in blob and "\u980c" not in evil.decode("ascii")  # the reviewer sees kanji only
    assert (ci / "patches" / "0003-evil.patch").read_bytes() == evil  # the checkout holds the payload
    for command in ("check", "apply"):
        proc = tool(ci, command, cache=tmp_path / "cache")
        assert proc.returncode != 0, proc.stdout + proc.stderr
        assert "patches/0003-evil.patch: git converts it on checkout (working-tree-encoding=ISO-2022-JP)" \
            in proc.stderr, proc.stderr
    assert not (ci / "megatron").exists()
    assert not (ci / ".rebase" / "work" / A).exists() or "pwned" not in (ci / ".rebase" / "work" / A).read_text()


@pytest.mark.parametrize("rel, attribute", [
    ("upstream.toml", "eol=crlf"),
    ("patches/series", "text eol=crlf"),
    ("patches/0001-keep-alpha.patch", "ident"),
    ("patches/0002-tweak-beta.patch", "filter=lfs"),
])
def test_any_attribute_that_converts_a_tool_input_is_refused(tmp_path, rel, attribute):
    def payload(pr):
        (pr / ".gitattributes").write_text(f"/{rel} {attribute}\n")
        if attribute == "ident":  # ident rewrites only a file that holds $Id$ (a patch's message may)
            text = (pr / rel).read_text()
            (pr / rel).write_text(text.replace("Why it exists.", "Why it exists. $Id$", 1))
    fork = committed_fork(tmp_path)
    ci = pull_request(fork, tmp_path, payload)
    proc = tool(ci, "check", cache=tmp_path / "cache")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert f"{rel}: git converts it on checkout" in proc.stderr, proc.stderr


def test_attributes_that_keep_the_bytes_pass(tmp_path):
    """The fork's own .gitattributes (``-text``, ``merge=union``) changes no byte: check passes."""
    def payload(pr):
        (pr / ".gitattributes").write_text("patches/*.patch -text\npatches/series merge=union\n")
    fork = committed_fork(tmp_path)
    ci = pull_request(fork, tmp_path, payload)
    proc = tool(ci, "check", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
