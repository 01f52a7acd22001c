"""Two cold ``apply`` runs in two checkouts sharing one empty download cache (two CI jobs on one
``FORK_REBASE_CACHE``): the per-key cache lock makes them fetch once and both succeed, the entry is
whole, and a run killed while holding the lock neither jams the next one nor leaves its half file."""

import hashlib
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.tools.bumpkit import sh
from tests.tools.hostile import REPO_ROOT, committed_fork, pull_request, start_tool, tool
from tests.tools.sdists import pinned_to_sdist, pip_sees_only, write_sdist

PACKAGE, VERSION = "cachedcore", "1.0"
SDIST = f"{PACKAGE}-{VERSION}.tar.gz"


class _Index(http.server.BaseHTTPRequestHandler):
    """A simple-API index serving one sdist; each download is counted and takes ``delay`` seconds,
    so two runs that do not wait for each other are both inside it at once."""

    body, sha, delay, downloads = b"", "", 0.0, []

    def do_GET(self):  # noqa: N802 (the http.server name)
        if self.path.rstrip("/").endswith(f"/simple/{PACKAGE}"):
            page = f'<a href="/files/{SDIST}#sha256={self.sha}">{SDIST}</a>\n'.encode()
            self._send(page, "text/html")
        elif self.path == f"/files/{SDIST}":
            self.downloads.append(time.monotonic())
            time.sleep(self.delay)
            self._send(self.body, "application/octet-stream")
        else:
            self.send_error(404)

    def _send(self, data: bytes, ctype: str):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args):
        pass


@pytest.fixture
def index(tmp_path, monkeypatch):
    """pip's one index: a local HTTP server holding ``cachedcore-1.0.tar.gz``."""
    path = tmp_path / "served" / SDIST
    sha = write_sdist(path, f"{PACKAGE}-{VERSION}", {
        "megatron/core/__init__.py": "",
        "megatron/core/package_info.py": "MAJOR = 1\nMINOR = 3\nPATCH = 0\nPRE_RELEASE = ''\n",
    })
    handler = type("Index", (_Index,), {"body": path.read_bytes(), "sha": sha, "delay": 1.5, "downloads": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for key in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(key, raising=False)
    pip_sees_only(monkeypatch, index_url=f"http://127.0.0.1:{server.server_address[1]}/simple/")
    monkeypatch.setenv("FORK_REBASE_ALLOW_PACKAGE", PACKAGE)
    yield handler
    server.shutdown()


def _checkouts(tmp_path, sha: str, count: int) -> list:
    """``count`` CI clones of a fork pinned to the served sdist (no patches on it)."""
    fork = committed_fork(tmp_path)
    payload = pinned_to_sdist(PACKAGE, VERSION, sha)
    return [pull_request(fork, tmp_path, payload, name=f"ci-{i}") for i in range(count)]


def _entry_is_whole(cache: Path, sha: str):
    assert hashlib.sha256((cache / "sdist" / SDIST).read_bytes()).hexdigest() == sha
    assert not list((cache / "sdist").glob("*.part")), list((cache / "sdist").iterdir())


@pytest.mark.slow
def test_two_cold_applies_on_one_empty_cache_fetch_once_and_both_succeed(tmp_path, index):
    cache = tmp_path / "shared-cache"
    first, second = _checkouts(tmp_path, index.sha, 2)
    runs = [start_tool(ci, "apply", cache=cache) for ci in (first, second)]
    results = [run.communicate(timeout=120) + (run.returncode,) for run in runs]
    for out, err, code in results:
        assert code == 0, err
    assert len(index.downloads) == 1, f"{len(index.downloads)} downloads of one cache entry"
    _entry_is_whole(cache, index.sha)
    for ci in (first, second):
        assert "MINOR = 3" in (ci / "megatron" / "core" / "package_info.py").read_text()


_HOLDER = """
import sys, time
from pathlib import Path
from tools.rebase.git.lock import key_locked
folder = Path(sys.argv[1])
folder.mkdir(parents=True, exist_ok=True)
with key_locked(folder, sys.argv[2]):
    (folder / ("." + sys.argv[2] + ".killed.part")).write_bytes(b"half an archive")
    print("holding", flush=True)
    time.sleep(600)
"""


@pytest.mark.slow
def test_a_run_killed_while_holding_the_entrys_lock_does_not_jam_the_next_or_leave_its_half_file(
        tmp_path, index):
    cache = tmp_path / "shared-cache"
    (ci,) = _checkouts(tmp_path, index.sha, 1)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(cache / "sdist"), SDIST], cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    started = time.monotonic()
    proc = tool(ci, "apply", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started < 60
    assert len(index.downloads) == 1
    _entry_is_whole(cache, index.sha)


def test_two_cold_applies_of_a_git_pin_on_one_empty_cache_both_succeed_with_one_whole_mirror(tmp_path):
    fork = committed_fork(tmp_path)
    first, second = (pull_request(fork, tmp_path, lambda pr: None, name=f"ci-{i}") for i in range(2))
    cache = tmp_path / "shared-cache"
    runs = [start_tool(ci, "apply", cache=cache) for ci in (first, second)]
    for run in runs:
        _, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
    (mirror,) = (cache / "git").glob("*.git")
    assert (mirror / "megatron-rebase-mirror").is_file()
    sh("git", "fsck", "--no-dangling", cwd=mirror)
    assert not [p for p in (cache / "git").iterdir() if p.name.startswith(".")], "a staging folder was left"
