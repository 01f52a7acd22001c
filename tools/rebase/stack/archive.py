"""A git pin's tree without git history: upstream's archive of the pinned commit (GitHub serves one
per commit), checked against the tree digest the pin records (``tree_sha256``).

``pip install`` of a line (``MEGATRON_FORK_LINE``) on a machine without a mirror takes this path:
an archive of a few MB instead of upstream's whole history. The digest is over the tree, not the
archive's bytes (those depend on the server's compressor), so it is computed the same way from a
mirror's commit (``commit_tree_digest``) and from an archive (``archive_entries``): one line per
file, ``<mode> <sha256 of its bytes> <path>``, sorted by path. A verified archive is imported as
the same base commit a mirror gives (the same tree, dated by the archive's members, which is the
commit's date), so the patches on it are the same commits either way.
"""

import hashlib
import os
import re
import tarfile
import urllib.request
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import git
from tools.rebase.git.owned import is_marked_file, mark_file

# ``FORK_REBASE_ARCHIVE_URL`` (environment only, never the checkout): where to download a commit's
# archive, ``{commit}`` standing for the id; the default is GitHub's archive of the pinned repository.
ARCHIVE_URL_ENV = "FORK_REBASE_ARCHIVE_URL"
ARCHIVE_PURPOSE = "a verified upstream archive"
_GITHUB = re.compile(r"^https://github\.com/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?$")
# Megatron-LM at d48bd6be: 3,337 files, 60 MB unpacked; the bounds leave room and stop a bomb.
MAX_FILES, MAX_BYTES = 50_000, 1 << 30
_MODES = {"100644", "100755", "120000"}


def archive_url(pin) -> str:
    template = os.environ.get(ARCHIVE_URL_ENV, "")
    if template:
        return template.replace("{commit}", pin.commit)
    m = _GITHUB.match(pin.url)
    if not m:
        raise RebaseError(f"{pin.url}: no archive URL is known for this repository; give a local clone "
                          f"(--mirror PATH, or FORK_REBASE_MIRROR for pip) or set {ARCHIVE_URL_ENV}")
    return f"https://codeload.github.com/{m[1]}/{m[2]}/tar.gz/{pin.commit}"


def digest_of(entries) -> str:
    """The tree digest of ``(path, mode, data)`` entries (files and links; folders are implied)."""
    h = hashlib.sha256()
    for path, mode, data in sorted(entries, key=lambda e: e[0].encode("utf-8", "surrogateescape")):
        h.update(f"{mode} {hashlib.sha256(data).hexdigest()} {path}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def commit_tree_digest(repo: Path, commit: str) -> str:
    """The tree digest of ``commit`` in ``repo`` (what a line's pin records as ``tree_sha256``)."""
    listing = git("ls-tree", "-r", "-z", "--full-tree", commit, cwd=repo, binary=True)
    records = []
    for record in listing.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        mode, kind, oid = meta.decode().split()
        if kind != "blob":
            raise RebaseError(f"{commit}: {path.decode('utf-8', 'replace')} is a {kind}; an archive cannot "
                              f"carry it, so the commit has no tree digest")
        records.append((path.decode("utf-8", "surrogateescape"), mode, oid))
    blobs = _read_blobs(repo, [oid for _, _, oid in records])
    return digest_of((path, mode, blobs[oid]) for path, mode, oid in records)


def _read_blobs(repo: Path, oids: list) -> dict:
    out = git("cat-file", "--batch", cwd=repo, input=b"".join(o.encode() + b"\n" for o in oids), binary=True)
    blobs, pos = {}, 0
    while pos < len(out):
        end = out.index(b"\n", pos)
        oid, _, size = out[pos:end].decode().split()
        blobs[oid] = out[end + 1:end + 1 + int(size)]
        pos = end + 1 + int(size) + 1
    return blobs


def archive_entries(fileobj, label: str, commit: str) -> tuple[list, int]:
    """``([(path, mode, data)], newest mtime)`` of a tar archive of one commit: one top folder
    (stripped), files and links only; anything else, a name leaving the folder, or a commit id in
    its header that is not ``commit`` is refused."""
    entries, newest, total, tops = [], 0, 0, set()
    try:
        with tarfile.open(fileobj=fileobj, mode="r:*") as tar:
            stamped = tar.pax_headers.get("comment", "")
            for m in tar:
                parts = m.name.split("/")
                if m.name.startswith("/") or ".." in parts or "\\" in m.name:
                    raise RebaseError(f"{label}: refusing unsafe member {m.name!r}")
                tops.add(parts[0])
                newest = max(newest, int(m.mtime))
                if m.isdir() or (m.type == tarfile.XGLTYPE):
                    continue
                rest = "/".join(p for p in parts[1:] if p)
                if len(parts) < 2 or not rest:
                    raise RebaseError(f"{label}: member {m.name!r} is outside the archive's one top folder")
                if m.issym():
                    entries.append((rest, "120000", m.linkname.encode("utf-8", "surrogateescape")))
                elif m.isfile():
                    total += m.size
                    if total > MAX_BYTES or len(entries) >= MAX_FILES:
                        raise RebaseError(f"{label}: over {MAX_FILES} files or {MAX_BYTES} bytes; refused")
                    data = tar.extractfile(m).read()
                    entries.append((rest, "100755" if m.mode & 0o111 else "100644", data))
                else:
                    raise RebaseError(f"{label}: refusing member {m.name!r} (not a file, folder or link)")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise RebaseError(f"{label}: not a readable tar archive ({exc})") from None
    if stamped and stamped != commit:
        raise RebaseError(f"{label}: the archive is of commit {stamped}, not the pinned {commit}")
    if len(tops) != 1:
        raise RebaseError(f"{label}: expected one top-level folder, found {len(tops)}")
    return entries, newest


def write_tree(work: Path, entries: list) -> str:
    """Write ``entries`` as a tree into ``work``'s objects (``git fast-import``: no files on disk,
    so no link in the archive is ever followed); return the tree id."""
    ref = f"refs/archive-import/{os.getpid()}"
    stream = [f"commit {ref}\ncommitter a <a> 0 +0000\ndata 0\n".encode()]
    for path, mode, data in entries:
        stream.append(f"M {mode} inline ".encode() + _quoted(path) + f"\ndata {len(data)}\n".encode() + data + b"\n")
    stream.append(b"done\n")
    git("fast-import", "--quiet", "--done", cwd=work, input=b"".join(stream), binary=True)
    tree = git("rev-parse", f"{ref}^{{tree}}", cwd=work).strip()
    git("update-ref", "-d", ref, cwd=work)
    return tree


def _quoted(path: str) -> bytes:
    """A fast-import path: C-quoted whenever it holds a quote, backslash, newline or space."""
    raw = path.encode("utf-8", "surrogateescape")
    if not any(c in raw for c in b'"\\\n '):
        return raw
    return b'"' + raw.replace(b"\\", b"\\\\").replace(b'"', b'\\"').replace(b"\n", b"\\n") + b'"'


def verified_archive(cache: Path, pin, log) -> tuple[list, int]:
    """The pinned commit's archive entries, their digest equal to the pin's ``tree_sha256``: from
    the cache, or downloaded once (only a verified archive is kept there)."""
    from tools.rebase.git.lock import key_locked
    from tools.rebase.git.safefs import exclusive_temp, makedirs

    if not pin.tree_sha256:
        raise RebaseError(f"the pin of {pin.url}@{pin.commit} records no tree_sha256, so its archive cannot be "
                          f"checked; give a local clone of upstream (--mirror PATH, FORK_REBASE_MIRROR for pip)")
    folder = makedirs(cache, Path(cache) / "archive")
    target = folder / f"{pin.commit}.tar.gz"
    with key_locked(folder, target.name):
        if is_marked_file(target, ARCHIVE_PURPOSE):
            with open(target, "rb") as fh:
                return _checked(fh, str(target), pin)
        url = archive_url(pin)
        log(f"downloading upstream's archive of {pin.commit} ({url}); its tree is checked against the pin's "
            f"tree_sha256 before anything is used")
        out, part = exclusive_temp(folder, f".{target.name}.", ".part")
        try:
            with out:
                try:
                    with urllib.request.urlopen(url, timeout=120) as response:
                        for block in iter(lambda: response.read(1 << 20), b""):
                            out.write(block)
                except OSError as exc:
                    raise RebaseError(f"could not download {url}: {exc}; nothing was cached") from None
            with open(part, "rb") as fh:
                found = _checked(fh, url, pin)
            os.replace(part, target)
            mark_file(target, ARCHIVE_PURPOSE)
            return found
        finally:
            if os.path.lexists(part):
                os.unlink(part)


def _checked(fh, label: str, pin) -> tuple[list, int]:
    entries, newest = archive_entries(fh, label, pin.commit)
    digest = digest_of(entries)
    if digest != pin.tree_sha256:
        raise RebaseError(f"{label}: its tree digest is {digest}, but the pin of {pin.commit} records "
                          f"tree_sha256 {pin.tree_sha256}; nothing from it was used or cached")
    return entries, newest
