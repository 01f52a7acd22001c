"""The repo's own recorded bump (0.19.0 -> 0.19.2) replays on a fresh checkout without stopping.

Reconstructs the pin and patches/ from the commit before the bump, bumps them with the tool, and
requires the committed pin, patches/ and report mapping to come out again (resolutions recorded
in patches/resolutions/ are used if the replay needs them). Needs the git history of this
checkout and the two sdists (cached, or downloadable with pip).
"""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tools.rebase.bump.bump import bump
from tools.rebase.errors import RebaseError
from tools.rebase.git.paths import Layout

REPO = Path(__file__).resolve().parents[3]
OLD, NEW = "0.19.0", "0.19.2"


def _git(*args):
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)


def _bump_commit():
    """The commit whose upstream.toml moved from OLD to NEW."""
    log = _git("log", "--format=%H", "--", "upstream.toml")
    if log.returncode != 0:
        return None
    for sha in log.stdout.split():
        before = _git("show", f"{sha}^:upstream.toml").stdout
        after = _git("show", f"{sha}:upstream.toml").stdout
        if f'version = "{OLD}"' in before and f'version = "{NEW}"' in after:
            return sha
    return None


def _materialize(rev, root: Path):
    (root / "patches").mkdir(parents=True)
    names = _git("ls-tree", "--name-only", f"{rev}:patches").stdout.split()
    for name in names:
        if name == "series" or name.endswith(".patch"):
            data = subprocess.run(["git", "show", f"{rev}:patches/{name}"], cwd=REPO, capture_output=True).stdout
            (root / "patches" / name).write_bytes(data)
    if _git("cat-file", "-e", f"{rev}:patches/resolutions").returncode == 0:
        subprocess.run(f"git archive {rev} patches/resolutions | tar -x -C {root}", shell=True, cwd=REPO, check=True)
    (root / "upstream.toml").write_text(_git("show", f"{rev}:upstream.toml").stdout)
    tests = root / "tests"
    shutil.copytree(REPO / "tests", tests)  # Tests: trailers must resolve


@pytest.mark.slow
def test_recorded_bump_replays_from_a_fresh_checkout(tmp_path, monkeypatch):
    sha = _bump_commit()
    if sha is None:
        pytest.skip("no commit moving upstream.toml from 0.19.0 to 0.19.2 in this checkout's history")
    cache = REPO / ".rebase" / "cache"
    monkeypatch.setenv("FORK_REBASE_CACHE", str(cache))
    root = tmp_path / "fresh"
    _materialize(f"{sha}^", root)
    layout = Layout(root)
    ran = []
    try:
        data = bump(layout, f"pypi:megatron-core=={NEW}", log=lambda *_: None,
                    test_runner=lambda _l, name, ids: ran.append(name) or {i: "passed" for i in ids})
    except RebaseError as exc:
        if "could not download" in str(exc):
            pytest.skip(f"sdists unavailable: {exc}")
        raise
    committed = root.parent / "committed"
    _materialize(sha, committed)
    assert (root / "upstream.toml").read_text() == (committed / "upstream.toml").read_text()
    produced = {p.name: p.read_bytes() for p in sorted((root / "patches").glob("*")) if p.is_file()}
    expected = {p.name: p.read_bytes() for p in sorted((committed / "patches").glob("*")) if p.is_file()}
    assert produced == expected
    recorded = json.loads((REPO / "REBASE_REPORT.json").read_text())
    if (recorded["old"]["base"].get("version"), recorded["new"]["base"].get("version")) != (OLD, NEW):
        pytest.skip("REBASE_REPORT.json now describes a later bump")
    assert data["old"]["tip"] == recorded["old"]["tip"] and data["new"]["tip"] == recorded["new"]["tip"]
    strip = lambda rows: [{k: v for k, v in r.items() if k != "tests"} for r in rows]  # noqa: E731
    assert strip(data["mapping"]) == strip(recorded["mapping"])
