"""``prove`` holds the checkout's lock for its whole run (issue 22 leftover), with real processes:
while one proves, ``apply``, ``export`` and a second ``prove --record`` are refused naming it, and a
``prove --record`` started while another command holds the lock waits and then proves the stack as
that command left it, so a verdict is never recorded for a stack that changed under the run."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.tools.bumpkit import make_fork, replace_line
from tools.rebase.git.lock import locked
from tools.rebase.proof.listing import BEGIN, END
from tools.rebase.proof.record import stack_digest_now

REPO_ROOT = Path(__file__).resolve().parents[3]
UPSTREAM = {
    "megatron/core/package_info.py": "MAJOR = 0\nMINOR = 42\nPATCH = 1\nPRE_RELEASE = ''\n",
    "megatron/core/__init__.py": "",
    "megatron/core/alpha.py": "def value():\n    return 7\n",
    "megatron/core/beta.py": "B = 0\n",
}
TESTS = {
    "tests/test_alpha.py": "from megatron.core.alpha import value\n\n\ndef test_not_seven():\n    assert value() != 7\n",
    "tests/test_beta.py": "from megatron.core import beta\n\n\ndef test_beta_set():\n    assert beta.B == 1\n",
}
ALPHA = ("alpha-seventy", {"megatron/core/alpha.py": replace_line("return 7", "return 70")},
         None, "Why.", "tests/test_alpha.py::test_not_seven")
BETA = ("beta-one", {"megatron/core/beta.py": "B = 1\n"}, None, "Why.", "tests/test_beta.py::test_beta_set")
# `prove ARGS` in-process in a child, stopped before each patch's test run until a line on stdin.
PAUSED_PROVE = (
    "import sys\nfrom tools.rebase.proof import prove\nfrom tools.rebase.launch import main\n"
    "real = prove.run_tests\n"
    "def paused(*a, **k):\n    print('proving', flush=True); sys.stdin.readline(); return real(*a, **k)\n"
    "prove.run_tests = paused\nsys.exit(main(['-C', sys.argv[1], 'prove', *sys.argv[2:]]))\n"
)


def _fork(tmp_path, monkeypatch, patches):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork = make_fork(tmp_path, files=UPSTREAM)
    for rel, text in TESTS.items():
        (fork.root / rel).write_text(text)
    (fork.root / "README.md").write_text(f"# fork\n\n{BEGIN}\n{END}\n")  # the table --record fills
    fork.stack(patches)
    return fork


def _cli(fork, *args, wait="0"):
    return subprocess.run([sys.executable, "-m", "tools.rebase", "-C", str(fork.root), *args], cwd=REPO_ROOT,
                          env=dict(os.environ, FORK_REBASE_LOCK_WAIT=wait), capture_output=True, text=True)


def _recorded(fork) -> dict:
    return json.loads((fork.layout.patches / "proof.json").read_text())


def test_while_prove_record_runs_apply_export_and_another_record_are_refused_naming_it(tmp_path, monkeypatch):
    fork = _fork(tmp_path, monkeypatch, [ALPHA])
    prover = subprocess.Popen([sys.executable, "-c", PAUSED_PROVE, str(fork.root), "--record"], cwd=REPO_ROOT,
                              env=os.environ, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert prover.stdout.readline().strip() == "proving", prover.stderr.read()
        patches_before = fork.patch_files()
        for args in (["apply", "--force"], ["export"], ["prove", "--record"], ["prove", "alpha-seventy"]):
            proc = _cli(fork, *args)
            assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
            assert f"is held by pid {prover.pid} (prove --record)" in proc.stderr, (args, proc.stderr)
        assert fork.patch_files() == patches_before
        out, err = prover.communicate("\n", timeout=120)
    finally:
        prover.kill()
    assert prover.returncode == 0, err
    record = _recorded(fork)
    assert [p["name"] for p in record["patches"]] == ["alpha-seventy"]
    assert record["stack_digest"] == stack_digest_now(fork.layout)
    assert _cli(fork, "apply").returncode == 0  # released at the end


@pytest.mark.slow
def test_prove_record_waits_for_the_holder_then_proves_the_stack_it_left(tmp_path, monkeypatch):
    """The holder changes the stack (a patch added and exported) while ``prove --record`` waits:
    the record must name the new stack, not the one on disk when prove was started."""
    fork = _fork(tmp_path, monkeypatch, [ALPHA])
    with locked(fork.layout, "export"):
        prover = subprocess.Popen([sys.executable, "-m", "tools.rebase", "-C", str(fork.root), "prove", "--record"],
                                  cwd=REPO_ROOT, env=dict(os.environ, FORK_REBASE_LOCK_WAIT="120"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(4)  # long enough for an unlocked prove to read the stack and start its first build
        assert prover.poll() is None and not (fork.layout.patches / "proof.json").exists()
        fork.stack([BETA])  # re-entrant in this process: it holds the lock
    out, err = prover.communicate(timeout=180)
    assert prover.returncode == 0, err
    record = _recorded(fork)
    assert [(p["name"], p["verdict"]) for p in record["patches"]] == [("alpha-seventy", "proven"), ("beta-one", "proven")]
    assert record["stack_digest"] == stack_digest_now(fork.layout)
