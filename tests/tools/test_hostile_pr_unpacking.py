"""Issue 46, Low items: what the tool unpacks and reads cannot exhaust or hang the machine. An sdist
whose members add up to more than ``MAX_EXTRACTED_BYTES`` (a small archive of zeros unpacks to
hundreds of MB) is refused before anything is written, and a FIFO where the tool reads its state
(an unpacked archive can carry one) is an error, not a hang."""

import os
import subprocess
import sys

from tests.tools.hostile import REPO_ROOT, committed_fork, pull_request, tool_env, unpacked_archive
from tests.tools.sdists import pinned_to_sdist, write_sdist


def test_an_sdist_that_unpacks_past_the_bound_is_refused_before_writing(tmp_path, find_links, monkeypatch, capsys):
    from tools.rebase.cli import main
    from tools.rebase.stack import source

    files = {"PKG-INFO": "Name: megatron-core\n", "megatron/core/__init__.py": "",
             "megatron/core/package_info.py": "MAJOR = 9\nMINOR = 9\nPATCH = 9\n",
             "megatron/core/zeros.py": "#" + "0" * 20000 + "\n"}
    sha = write_sdist(find_links / "megatron_core-9.9.9.tar.gz", "megatron_core-9.9.9", files)
    ci = pull_request(committed_fork(tmp_path), tmp_path, pinned_to_sdist("megatron-core", "9.9.9", sha))
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(source, "MAX_EXTRACTED_BYTES", 10000)
    assert main(["-C", str(ci), "apply"]) != 0
    err = capsys.readouterr().err
    assert "refusing to extract" in err and "would fill the disk" in err, err
    assert not list((tmp_path / "cache").rglob("zeros.py")) and not (ci / "megatron").exists()


def test_a_fifo_at_the_state_file_is_an_error_not_a_hang(tmp_path):
    fork = committed_fork(tmp_path)
    ci = pull_request(fork, tmp_path, lambda pr: None)
    unpacked = unpacked_archive(tmp_path, ci, keep=lambda rel: False)
    (unpacked / ".rebase").mkdir(exist_ok=True)
    os.mkfifo(unpacked / ".rebase" / "state.json")
    proc = subprocess.run([sys.executable, "-m", "tools.rebase", "-C", str(unpacked), "apply"], cwd=REPO_ROOT,
                          env=tool_env(cache=tmp_path / "cache"), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "state.json: not a regular file" in proc.stderr, proc.stderr
