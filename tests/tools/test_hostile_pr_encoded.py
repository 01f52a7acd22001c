"""Issue 46, item 1: a patch is validated as git am decodes it. The exporter writes only From, Date,
Subject and, for non-ASCII text, MIME-Version 1.0, a text/plain UTF-8 Content-Type and an 8bit
Content-Transfer-Encoding; any other mail header (a quoted-printable or base64 encoding that git's
mailinfo would decode before applying, another charset it would convert from) is refused."""

import pytest

from tests.tools.hostile import committed_fork, pull_request, tool

# The tool's own entry, quoted-printable: raw, the folded line is part of the Tests trailer; decoded
# (=0A is a newline), it is a patch adding tools/rebase/__main__.py that writes a marker.
EVIL_DIFF = ("diff --git a/tools/rebase/__main__.py b/tools/rebase/__main__.py\nnew file mode 100644\n"
             "--- /dev/null\n+++ b/tools/rebase/__main__.py\n@@ -0,0 +1 @@\n"
             "+open('/tmp/MARKER', 'w').write('ran')\n")


def _qp(text: str) -> str:
    return "".join(f"={ord(c):02X}" if c in "=\n" or not c.isprintable() else c for c in text)


def _encode(patch: str, headers: str, marker) -> str:
    head, sep, rest = patch.partition("\n\n")
    evil = _qp(EVIL_DIFF.replace("/tmp/MARKER", str(marker)))
    body, tests_sep, tail = rest.partition("\nTests: ")
    tests_line, nl, after = tail.partition("\n")
    rest = f"{body}{tests_sep}{tests_line}\n =0A=0A{evil}{nl}{after}"
    return head + "\n" + headers + sep + rest


HEADERS = {
    "quoted-printable": ("Content-Transfer-Encoding: quoted-printable\n", "Content-Transfer-Encoding"),
    "base64": ("MIME-Version: 1.0\nContent-Transfer-Encoding: base64\n", "Content-Transfer-Encoding"),
    "charset": ("MIME-Version: 1.0\nContent-Type: text/plain; charset=UTF-7\n", "Content-Type"),
    "multipart": ("MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=x\n", "Content-Type"),
    "other header": ("X-Mailer: anything\n", "X-Mailer"),
    "lower case": ("content-transfer-encoding: quoted-printable\n", "content-transfer-encoding"),
    "twice": ("Subject: again\n", "Subject"),
}


@pytest.mark.parametrize("case", sorted(HEADERS))
def test_a_patch_with_a_mail_header_the_exporter_never_writes_is_refused(tmp_path, case):
    headers, named = HEADERS[case]
    fork = committed_fork(tmp_path)
    marker = tmp_path / "MARKER"
    name = "0002-tweak-beta.patch"

    def payload(pr):
        path = pr / "patches" / name
        path.write_text(_encode(path.read_text(), headers, marker))

    ci = pull_request(fork, tmp_path, payload)
    proc = tool(ci, "apply", cache=tmp_path / "cache")
    assert proc.returncode != 0, proc.stdout
    assert name in proc.stderr and named in proc.stderr, proc.stderr
    assert not (ci / ".rebase" / "work" / "tools").exists()
    proc = tool(ci, "check", cache=tmp_path / "cache")
    assert proc.returncode != 0 and named in proc.stderr + proc.stdout
    assert not marker.exists()


def test_the_exporters_own_headers_for_non_ascii_text_are_accepted(tmp_path):
    """format-patch marks a non-ASCII message with these three headers; apply takes them."""
    fork = committed_fork(tmp_path)

    def payload(pr):
        path = pr / "patches" / "0002-tweak-beta.patch"
        head, sep, rest = path.read_text().partition("\n\n")
        mime = ("MIME-Version: 1.0\nContent-Type: text/plain; charset=UTF-8\n"
                "Content-Transfer-Encoding: 8bit\n")
        path.write_text(head + "\n" + mime + sep + "Caf\u00e9 reason.\n\n" + rest)

    ci = pull_request(fork, tmp_path, payload)
    proc = tool(ci, "apply", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
