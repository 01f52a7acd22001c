"""The mail headers of a patch file, read as git am's mailinfo reads them and held to what the
exporter writes: mailinfo decodes and converts the body by some of them before git apply reads it,
so the validator only sees the text git applies when no such header can say otherwise."""

from tools.rebase.errors import RebaseError

# The mail headers the exporter (git format-patch with FORMAT_PATCH_FLAGS) writes, and the only
# values of its MIME ones (a non-ASCII message). git am's mailinfo decodes a quoted-printable or
# base64 body and converts another charset before git apply reads it; refusing every other header
# and value keeps the text validated here the text git applies.
MAIL_HEADERS = {"from": None, "date": None, "subject": None, "mime-version": "1.0",
                "content-type": "text/plain; charset=utf-8", "content-transfer-encoding": "8bit"}


def read_headers(where: str, lines: list):
    """The mail headers (names lower-cased, folded lines joined) and the index of the blank line
    after them; a header the exporter never writes, or one written twice, is an error. Folded
    lines are collected and joined once (appending each to the joined value took quadratic time)."""
    parts, spelled, i, last = {}, {}, 1, None
    while i < len(lines) and lines[i] != "":
        line = lines[i]
        if line[:1] in (" ", "\t") and last:
            parts[last].append(line.strip())
        elif ":" in line:
            name, _, value = line.partition(":")
            last = name.strip().lower()
            if last not in MAIL_HEADERS:
                raise RebaseError(f"{where}:{i + 1}: refusing the mail header {name!r}: the exporter writes "
                                  f"only {', '.join(h.title() for h in MAIL_HEADERS)}, and git am could "
                                  f"decode or convert the patch by another one before applying it")
            if last in parts:
                raise RebaseError(f"{where}:{i + 1}: the mail header {name!r} is written twice")
            parts[last], spelled[last] = [value.strip()], name
        else:
            raise RebaseError(f"{where}:{i + 1}: malformed mail header {line!r}")
        i += 1
    headers = {name: " ".join(values) for name, values in parts.items()}
    for name, allowed in MAIL_HEADERS.items():
        if allowed is not None and name in headers and " ".join(headers[name].lower().split()) != allowed:
            raise RebaseError(f"{where}: refusing '{spelled[name]}: {headers[name]}': the exporter writes "
                              f"only {allowed!r} there (git am would decode or convert the text by it)")
    for required in ("from", "subject"):
        if required not in headers:
            raise RebaseError(f"{where}: missing '{required.title()}:' header")
    return headers, i
