"""Find and download one sdist through the simple API (PEP 503 HTML / PEP 691 JSON) of the index
pip is configured with, with no build step at all.

``pip download`` always prepares an sdist's metadata, which runs the archive's build backend
(hash-checking mode or not). Here the tool only asks pip where its indexes are (``pip config
list``, which reads pip's files and ``PIP_*`` variables, never the checkout), reads the project
page itself, and streams the archive into the cache while hashing it: nothing in the archive runs.
"""

import hashlib
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.git.safefs import exclusive_temp

MAX_BYTES = 1 << 30  # an sdist larger than 1 GiB is not the one we pin
_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"
_SCHEMES = ("http", "https", "file")


def canonical(name: str) -> str:
    """PEP 503 project name normalization."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _pip(*args) -> str:
    """Run the machine's pip isolated (``-I``: no ``PYTHONPATH``, no current folder on the path),
    so a ``pip/`` folder in the checkout can never stand in for it."""
    with tempfile.TemporaryDirectory() as empty:
        proc = subprocess.run([sys.executable, "-I", *args], capture_output=True, text=True, cwd=empty)
    return proc.stdout if proc.returncode == 0 else ""


def _pip_config() -> dict:
    """``{key: value}`` of pip's configuration for ``pip download``; environment wins over files."""
    proc_stdout = _pip("-m", "pip", "config", "list")
    files, env = {}, {}
    for line in proc_stdout.splitlines():
        m = re.match(r"^(?P<section>[^.]*)\.(?P<key>[a-z0-9-]+)='(?P<value>.*)'$", line)
        if not m:
            continue
        if m["section"] == ":env:":
            env[m["key"]] = m["value"]
        elif m["section"] in ("global", "download"):
            files[m["key"]] = m["value"]  # `download` is listed after `global` and overrides it
    return {**files, **env}


def _default_index() -> str:
    """pip's built-in index (named by pip itself, so this repository never names a host)."""
    return _pip("-c", "from pip._internal.models.index import PyPI; print(PyPI.simple_url)").strip()


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def configured_sources(config=None) -> tuple:
    """``(index URLs, find-links entries)`` in pip's order."""
    config = _pip_config() if config is None else config
    links = config.get("find-links", "").split()
    if _truthy(config.get("no-index", "")):
        return [], links
    index = config.get("index-url") or _default_index()
    indexes = ([index] if index else []) + config.get("extra-index-url", "").split()
    return indexes, links


class _Anchors(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.links.append(href)


def _context(config):
    cert = config.get("cert")
    return ssl.create_default_context(cafile=cert) if cert and os.path.isfile(cert) else None


def _open(url: str, config, accept=None):
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in _SCHEMES:
        raise RebaseError(f"{url}: only http, https and file URLs are read (pip's index configuration)")
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    timeout = float(config.get("timeout") or config.get("default-timeout") or 60)
    if scheme == "https":
        return urllib.request.urlopen(request, timeout=timeout, context=_context(config))
    return urllib.request.urlopen(request, timeout=timeout)


def _from_page(page_url: str, body: bytes, content_type: str) -> list:
    """``[(file name, url, sha256 or "")]`` listed on a project page or a find-links page."""
    out = []
    if "json" in content_type:
        data = json.loads(body)
        for entry in data.get("files", []) if isinstance(data, dict) else []:
            if isinstance(entry, dict) and isinstance(entry.get("url"), str) and isinstance(entry.get("filename"), str):
                sha = (entry.get("hashes") or {}).get("sha256", "")
                out.append((entry["filename"], urllib.parse.urljoin(page_url, entry["url"]), sha if isinstance(sha, str) else ""))
        return out
    parser = _Anchors()
    parser.feed(body.decode("utf-8", "replace"))
    for href in parser.links:
        url = urllib.parse.urljoin(page_url, href)
        split = urllib.parse.urlsplit(url)
        fragment = urllib.parse.parse_qs(split.fragment)
        name = urllib.parse.unquote(split.path.rsplit("/", 1)[-1])
        out.append((name, urllib.parse.urlunsplit(split._replace(fragment="")), fragment.get("sha256", [""])[0]))
    return out


def _is_sdist_of(file_name: str, package: str, version: str) -> bool:
    if not file_name.endswith(".tar.gz"):
        return False
    stem = file_name[: -len(".tar.gz")]
    name, sep, ver = stem.rpartition("-")
    return bool(sep) and canonical(name) == canonical(package) and ver == version


def candidates(package: str, version: str, config=None) -> list:
    """``[(url, served sha256 or "")]`` of the sdist ``package-version.tar.gz`` on pip's sources."""
    config = _pip_config() if config is None else config
    indexes, links = configured_sources(config)
    found, errors = [], []
    for index in indexes:
        page = index.rstrip("/") + f"/{canonical(package)}/"
        try:
            with _open(page, config, _ACCEPT) as resp:
                body, ctype = resp.read(32 << 20), resp.headers.get("Content-Type", "")
        except (OSError, ValueError) as exc:
            errors.append(f"{page}: {exc}")
            continue
        found += [(url, sha) for name, url, sha in _from_page(page, body, ctype) if _is_sdist_of(name, package, version)]
    for link in links:
        local = Path(urllib.parse.urlsplit(link).path) if link.startswith("file:") else Path(link)
        if not link.startswith(("http:", "https:")) and local.is_dir():
            found += [(entry.resolve().as_uri(), "") for entry in sorted(local.iterdir())
                      if entry.is_file() and _is_sdist_of(entry.name, package, version)]
            continue
        try:
            with _open(link if "://" in link else local.resolve().as_uri(), config) as resp:
                body, ctype = resp.read(32 << 20), resp.headers.get("Content-Type", "")
        except (OSError, ValueError) as exc:
            errors.append(f"{link}: {exc}")
            continue
        found += [(url, sha) for name, url, sha in _from_page(link, body, ctype) if _is_sdist_of(name, package, version)]
    if not found:
        where = ", ".join(indexes + links) or "none configured"
        detail = ("\n" + "\n".join(errors[-3:])) if errors else ""
        raise RebaseError(f"no sdist {package}-{version}.tar.gz on pip's indexes ({where}){detail}")
    return found


def download(url: str, expected: str, folder: Path, config=None, prefix: str = ".download-") -> tuple:
    """Stream ``url`` into a new file created exclusively in ``folder`` (named ``prefix`` + random +
    ``.part``) while hashing it; return ``(path, sha256, size)``. With ``expected``, a different
    hash deletes the file and is an error."""
    config = _pip_config() if config is None else config
    part, tmp = exclusive_temp(folder, prefix, ".part")
    h, size = hashlib.sha256(), 0
    try:
        with part as out, _open(url, config) as resp:
            while True:
                block = resp.read(1 << 20)
                if not block:
                    break
                size += len(block)
                if size > MAX_BYTES:
                    raise RebaseError(f"{url}: larger than {MAX_BYTES:,} bytes; not downloaded")
                h.update(block)
                out.write(block)
        actual = h.hexdigest()
        if expected and actual != expected:
            raise RebaseError(f"{url} has sha256 {actual}, not the expected {expected}")
        return Path(tmp), actual, size
    except BaseException:
        os.unlink(tmp)
        raise
