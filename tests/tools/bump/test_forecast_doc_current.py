"""The committed forecast onto upstream ``main`` (docs/forecast-upstream-main.md/.json) is the one
the documented command makes from the current stack.

Always: the JSON names exactly the series' patches it was made from, and the Markdown is the JSON
rendered. With a local clone of Megatron-LM named by ``MEGATRON_LM_MIRROR`` (about 30 s): the
forecast is made again, as the documented command makes it, and every patch's status must match.
A patch edit that changes no status (a comment) leaves the committed forecast current.
"""

import json
import os
import shutil
from pathlib import Path

import pytest

from tools.rebase.bump.forecast import forecast, outcome, render
from tools.rebase.git.paths import Layout
from tools.rebase.stack.series import read_series

REPO_ROOT = Path(__file__).resolve().parents[3]
DOC = REPO_ROOT / "docs" / "forecast-upstream-main"
URL = "https://github.com/NVIDIA/Megatron-LM.git"
COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
REGENERATE = (f"python -m tools.rebase bump --onto git:{URL}@{COMMIT} --mirror MIRROR --dry-run "
              f"--resolutions-from upstream-main --output docs/forecast-upstream-main.md "
              f"--json docs/forecast-upstream-main.json")


def committed():
    if not DOC.with_suffix(".json").is_file():
        pytest.skip("no committed forecast onto upstream main")
    return json.loads(DOC.with_suffix(".json").read_text())


def test_the_committed_forecast_names_the_current_series_and_matches_its_markdown():
    data = committed()
    assert data["onto"] == f"git:{URL}@{COMMIT}" and data["new_base"]["commit"] == COMMIT
    series = read_series(REPO_ROOT / "patches" / "series").names
    assert data["stack"]["patches"] == series, f"the series changed since the forecast was made; run {REGENERATE}"
    assert [f"{row['number']:04d}-{row['name']}.patch" for row in data["patches"]] == series
    assert DOC.with_suffix(".md").read_text() == render(data), f"the Markdown is not the JSON's; run {REGENERATE}"
    assert sum(data["counts"].values()) == len(series)


def test_the_forecast_made_again_has_the_same_outcome(tmp_path, monkeypatch):
    mirror = os.environ.get("MEGATRON_LM_MIRROR")
    if not mirror or not Path(mirror).is_dir():
        pytest.skip("set MEGATRON_LM_MIRROR to a local clone of Megatron-LM to re-run the forecast")
    data = committed()
    from tools.rebase.stack import gitsource

    root = tmp_path / "checkout"
    shutil.copytree(REPO_ROOT / "patches", root / "patches")
    shutil.copytree(REPO_ROOT / "lines" / "upstream-main", root / "lines" / "upstream-main")
    shutil.copyfile(REPO_ROOT / "upstream.toml", root / "upstream.toml")
    monkeypatch.setattr(gitsource, "MIRRORS", {})
    gitsource.use_mirror(URL, mirror)
    layout = Layout(root)
    again = forecast(layout, f"git:{URL}@{COMMIT}", resolutions_from=layout.for_line("upstream-main"))
    shown = {row["name"]: row["status"] for row in again["patches"]}
    assert shown == {row["name"]: row["status"] for row in data["patches"]}, (
        f"the forecast is stale ({outcome(again)} now, {outcome(data)} committed); run {REGENERATE}")
