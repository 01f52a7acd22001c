"""Synthetic sdists and the pip sources the tool reads them from, shared by the pin, security and
cache tests: a tarball written member by member, and pip configured to see one local folder only."""

import hashlib
import io
import os
import tarfile
from pathlib import Path


def write_sdist(path: Path, top: str, files: dict, mtime: int = 1_700_000_000) -> str:
    """Write ``path`` as a gzipped tarball of ``files`` (``{relative path: text}``) under ``top/``,
    every member dated ``mtime``; return its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size, info.mtime = len(data), mtime
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pip_sees_only(monkeypatch, *, find_links: str = "", index_url: str = "") -> None:
    """pip's configuration, as the tool asks for it, is this one find-links folder (or page) or
    this one index, with no configuration file, cache or other ``PIP_*`` setting."""
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    if find_links:
        monkeypatch.setenv("PIP_NO_INDEX", "1")
        monkeypatch.setenv("PIP_FIND_LINKS", find_links)
    if index_url:
        monkeypatch.setenv("PIP_INDEX_URL", index_url)


def pinned_to_sdist(package: str, version: str, sha256: str):
    """A pull request's payload (``hostile.pull_request``): the pin names ``package==version`` by
    ``sha256``, and the series is emptied (no patch of the old base applies on it)."""
    def payload(pr: Path):
        (pr / "upstream.toml").write_text(
            f'[upstream]\nkind = "pypi"\npackage = "{package}"\nversion = "{version}"\nsha256 = "{sha256}"\n')
        for patch in (pr / "patches").glob("*.patch"):
            patch.unlink()
        (pr / "patches" / "series").write_text("# no patches on this base\n")
    return payload
