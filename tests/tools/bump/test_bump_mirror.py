"""``--mirror PATH`` (issue 15, item 12): objects come from a local mirror while the pin, the README
table and the report keep the canonical URL, never a machine path."""

import os
import subprocess
import sys
from pathlib import Path

from tests.tools.bumpkit import make_fork, replace_line, sh
from tools.rebase.stack import gitsource
from tools.rebase.proof.listing import BEGIN, END
from tools.rebase.stack.pin import load_pin

REPO_ROOT = Path(__file__).resolve().parents[3]
URL = "https://example.invalid/upstream/Megatron-LM.git"


def test_mirror_fetches_locally_and_pins_the_canonical_url(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("FORK_REBASE_CACHE", str(cache))
    monkeypatch.setattr(gitsource, "MIRRORS", {})
    fork = make_fork(tmp_path)
    v1 = sh("git", "rev-parse", "v1", cwd=fork.upstream).strip()
    fork.layout.pin.write_text(f'[upstream]\nkind = "git"\nurl = "{URL}"\ncommit = "{v1}"\nref = "v1"\n')
    (fork.root / "README.md").write_text(f"# fork\n\n{BEGIN}\n{END}\n")
    gitsource.use_mirror(URL, fork.upstream)  # the old base comes from the mirror too
    fork.stack([("keep-alpha", {"megatron/core/alpha.py": replace_line("alpha line 10\n", "alpha line 10 fork\n")})])
    fork.upstream_commit({"megatron/core/beta.py": replace_line("beta line 3\n", "beta line 3 up\n")}, "up", tag="v2")

    env = dict(os.environ, FORK_REBASE_CACHE=str(cache))
    proc = subprocess.run([sys.executable, "-m", "tools.rebase", "-C", str(fork.root), "bump", "--no-tests",
                           "--onto", f"git:{URL}@v2", "--mirror", str(fork.upstream)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pin = load_pin(fork.layout.pin)
    assert pin.url == URL and pin.commit == sh("git", "rev-parse", "v2", cwd=fork.upstream).strip()
    for name in ("upstream.toml", "README.md", "REBASE_REPORT.md", "REBASE_REPORT.json"):
        text = (fork.root / name).read_text()
        assert str(tmp_path) not in text, name
    assert URL in (fork.root / "README.md").read_text()

    bad = subprocess.run([sys.executable, "-m", "tools.rebase", "-C", str(fork.root), "bump",
                          "--onto", f"git:{URL}@v2", "--mirror", str(tmp_path / "nope")],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "--mirror" in bad.stderr and "not a git repository" in bad.stderr
