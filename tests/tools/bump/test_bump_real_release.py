"""Bump a small synthetic stack between two real megatron-core releases (0.19.0 -> 0.19.2 sdists).

Uses the sdists in $FORK_REBASE_CACHE/sdist when present, else downloads them with pip; skips
(with the reason) when neither works.
"""

import os
import tempfile
from pathlib import Path

import pytest

from tests.tools.bumpkit import commit, patch_msg, quiet, replace_line
from tools.rebase.bump.bump import bump
from tools.rebase.proof.check import check
from tools.rebase.errors import RebaseError
from tools.rebase.git.paths import Layout
from tools.rebase.stack.pin import load_pin
from tools.rebase.stack.source import download_sdist, sha256_file
from tools.rebase.stack.workrepo import apply, export

REPO_ROOT = Path(__file__).resolve().parents[3]
OLD_SHA256 = "9c967f86ba8e52c6cc96341d5f0a96d639cc4a5563275c46228a8de8ccd3ab9f"
NEW_SHA256 = "de643eee32007a7504ad52f061103fe7432503603b6321c16c861eb67dbd3353"
MTP = "megatron/core/transformer/multi_token_prediction.py"
ROUTER = "megatron/core/transformer/moe/router.py"


@pytest.fixture(scope="module")
def sdist_cache():
    cache = Path(os.environ.get("FORK_REBASE_CACHE") or Path(tempfile.gettempdir()) / "fork-rebase-test-cache")
    try:
        for version in ("0.19.0", "0.19.2"):
            download_sdist(cache, "megatron-core", version)
    except RebaseError as exc:
        pytest.skip(f"megatron-core 0.19.0/0.19.2 sdists are not cached in {cache} and cannot be downloaded: "
                    f"{str(exc).splitlines()[0]}")
    return cache


@pytest.mark.slow
def test_bump_real_stack_0_19_0_to_0_19_2(tmp_path, sdist_cache, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(sdist_cache))
    assert sha256_file(sdist_cache / "sdist" / "megatron_core-0.19.2.tar.gz") == NEW_SHA256
    root = tmp_path / "fork"
    (root / "patches").mkdir(parents=True)
    (root / "patches" / "series").write_text("# real-release test series\n")
    (root / "upstream.toml").write_text(
        f'[upstream]\nkind = "pypi"\npackage = "megatron-core"\nversion = "0.19.0"\nsha256 = "{OLD_SHA256}"\n')
    (root / "tests").mkdir()
    (root / "tests" / "test_dummy.py").write_text("def test_ok():\n    assert True\n")
    layout = Layout(root)
    apply(layout, log=quiet)
    work = layout.work
    # 1: next to an import line 0.19.2 rewrites -> refreshed (context drift only)
    commit(work, {MTP: replace_line("from typing import TYPE_CHECKING, Callable, List, Optional, Union\n",
                                    "from typing import TYPE_CHECKING, Callable, List, Optional, Union  # fork\n")},
           patch_msg("mtp-typing-note"))
    # 2: exactly what 0.19.2 did to the MTP loop -> absorbed
    commit(work, {MTP: replace_line("(hidden_states, input_ids, position_ids, padding_mask) = self.layers[layer_idx](",
                                    "hidden_states, input_ids, position_ids, padding_mask = self.layers[layer_idx](")},
           patch_msg("mtp-unpack-style"))
    # 3: a file 0.19.2 does not touch -> same patch, renumbered after the absorbed one
    commit(work, {ROUTER: lambda t: t + "\n# fork: router marker\n"}, patch_msg("router-marker"))
    # 4: a new module
    commit(work, {"megatron/core/fork_rl_extra.py": "FORK_RL_EXTRA = True\n"}, patch_msg("rl-extra-module"))
    export(layout, log=quiet)

    asked = []  # the finishing gate asks for every patch's Tests: on the whole stack
    data = bump(layout, "pypi:megatron-core==0.19.2", log=quiet,
                test_runner=lambda _layout, name, ids: asked.append(name) or {i: "passed" for i in ids})

    assert "rl-extra-module" in asked and "router-marker" in asked
    pin = load_pin(layout.pin)
    assert (pin.kind, pin.version, pin.sha256) == ("pypi", "0.19.2", NEW_SHA256)
    assert data["old"]["base"]["sha256"] == OLD_SHA256 and data["new"]["base"]["version"] == "0.19.2"
    statuses = {(r["old"] or r["new"])[0]["subject"]: r["status"] for r in data["mapping"]}
    assert statuses == {"mtp-typing-note": "refreshed", "mtp-unpack-style": "absorbed",
                        "router-marker": "renumbered", "rl-extra-module": "renumbered"}
    assert sorted(p.name for p in layout.patches.glob("*.patch")) == [
        "0001-mtp-typing-note.patch", "0002-router-marker.patch", "0003-rl-extra-module.patch"]
    churn = {e["file"] for e in data["upstream_churn"]["entries"]}
    assert churn == {MTP}
    md = layout.report_md.read_text()
    assert "`megatron-core==0.19.0`" in md and f"sdist sha256 `{NEW_SHA256}`" in md
    assert "| 2 | — | `mtp-unpack-style` | mtp-unpack-style | absorbed |" in md
    apply(layout, log=quiet)
    info = (root / "megatron/core/package_info.py").read_text()
    assert "PATCH = 2" in info and "__version__ = '0.19.2+rl.3." in info
    assert check(layout, log=quiet) == []
