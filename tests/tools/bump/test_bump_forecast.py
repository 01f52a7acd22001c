"""``bump --onto SPEC --dry-run`` (issue 15, item 10): per-patch forecast in a scratch copy
(clean, recorded resolution, conflict with causes and type, absorbed, lint finding, a conflict
caused by a dropped patch's context); the checkout, pin, patches/, work repo and rerere cache are
untouched; exit 1 when a real bump would stop, 0 when it would run through."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools.bumpkit import UPSTREAM_FILES, all_pass, make_fork, quiet, replace_line, sh
from tools.rebase.bump.bump import Stopped, bump, bump_continue
from tools.rebase.bump.forecast import forecast

REPO_ROOT = Path(__file__).resolve().parents[3]
A, B, G = "megatron/core/alpha.py", "megatron/core/beta.py", "megatron/core/gamma.py"
CFG = "megatron/core/config.py"
FILES = dict(UPSTREAM_FILES, **{CFG: "class Config:\n" + "".join(f"    f{i}: int = {i}\n" for i in range(30))})


def untouched_state(fork):
    files, work = fork.snapshot()
    rr = sorted(p.relative_to(fork.work).as_posix() for p in (fork.work / ".git" / "rr-cache").rglob("*")) \
        if (fork.work / ".git" / "rr-cache").exists() else []
    rebase = sorted(p.name for p in fork.layout.state_dir.iterdir())
    return files, work, rr, rebase


def cli(fork, cache, *args):
    env = dict(os.environ, FORK_REBASE_CACHE=str(cache))
    return subprocess.run([sys.executable, "-m", "tools.rebase", "-C", str(fork.root), "bump", *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True)


def test_forecast_statuses_and_nothing_touched(tmp_path, cache):
    fork = make_fork(tmp_path, files=FILES)
    fork.stack([
        ("keep-alpha", {A: replace_line("alpha line 10\n", "alpha line 10 fork\n")}),
        ("upstreamed", {G: replace_line("gamma line 20\n", "gamma line 20 fixed\n")}),
        ("tweak-beta", {B: replace_line("beta line 5\n", "beta line 5 fork\n")}),
        ("more-beta", {B: replace_line("beta line 5 fork\n", "beta line 5 fork more\n")}),
        ("cfg-field", {CFG: replace_line("    f2: int = 2\n", "    f2: int = 2\n    extra: int = 1\n")}),
    ])
    absorbing = fork.upstream_commit({G: replace_line("gamma line 20\n", "gamma line 20 fixed\n")}, "up: gamma")
    cause = fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 upstream\n")}, "up: beta 5")
    fork.upstream_commit({CFG: replace_line("    f27: int = 27\n", "    f27: int = 27\n    extra: int = 1\n")},
                         "up: extra field", tag="v2")
    before = untouched_state(fork)
    data = forecast(fork.layout, f"git:{fork.upstream}@v2")
    assert untouched_state(fork) == before
    rows = {r["name"]: r for r in data["patches"]}
    assert [rows[n]["status"] for n in ("keep-alpha", "upstreamed", "tweak-beta", "more-beta", "cfg-field")] == [
        "clean", "absorbed", "conflict", "conflict", "lint finding"]
    assert rows["upstreamed"]["upstream"] == absorbing
    assert rows["tweak-beta"]["types"] == {B: "content"}
    assert [c["commit"] for c in rows["tweak-beta"]["causes"]] == [cause]
    assert rows["more-beta"]["after_dropped"] == ["tweak-beta"]
    assert "'extra' is defined twice in class Config" in rows["cfg-field"]["findings"][0]
    assert data["would_stop"] and data["new_base"]["commit"] == sh("git", "rev-parse", "v2", cwd=fork.upstream).strip()

    out_md, out_js = tmp_path / "f.md", tmp_path / "f.json"
    proc = cli(fork, cache, "--onto", f"git:{fork.upstream}@v2", "--dry-run", "--output", out_md, "--json", out_js)
    assert proc.returncode == 1, proc.stderr
    # Written to files, the forecast still says how it went on the terminal (issue 47, item 8).
    assert proc.stdout == ""
    assert (f"forecast: 1 absorbed, 1 clean, 2 conflict, 1 lint finding: a real bump would stop at "
            f"0003 tweak-beta (wrote {out_md} and {out_js})") in proc.stderr, proc.stderr
    assert json.loads(out_js.read_text())["patches"] == data["patches"]
    md = out_md.read_text()
    assert data["new_base"]["commit"] in md and "| 0003 | `tweak-beta` | conflict |" in md
    assert untouched_state(fork) == before


def test_forecast_uses_recorded_resolutions_and_exits_zero(tmp_path, cache):
    fork = make_fork(tmp_path)
    fork.stack([("tweak-beta", {B: replace_line("beta line 5\n", "beta line 5 fork\n")})])
    fork.upstream_commit({B: replace_line("beta line 5\n", "beta line 5 upstream\n")}, "up: beta 5", tag="v2")
    pin, patches = fork.layout.pin.read_bytes(), fork.patch_files()
    with pytest.raises(Stopped):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=all_pass)
    text = (fork.work / B).read_text()
    (fork.work / B).write_text(text.split("<<<<<<<")[0] + "beta line 5 both\n" + text.split(">>>>>>>")[1].split("\n", 1)[1])
    sh("git", "add", B, cwd=fork.work)
    bump_continue(fork.layout, log=quiet, test_runner=all_pass)
    clone = make_fork(tmp_path, name="clone")  # the old stack plus the recorded resolution
    clone.layout.pin.write_bytes(pin)
    for name, data in patches.items():
        (clone.layout.patches / name).write_bytes(data)
    shutil.copytree(fork.layout.resolutions, clone.layout.resolutions)
    from tools.rebase.stack.workrepo import apply

    apply(clone.layout, log=quiet)
    before = untouched_state(clone)
    proc = cli(clone, cache, "--onto", f"git:{fork.upstream}@v2", "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| 0001 | `tweak-beta` | resolved (recorded resolution) |" in proc.stdout
    assert "a real bump would run through" in proc.stdout
    assert "forecast: 1 resolved (recorded resolution): a real bump would run through" in proc.stderr
    assert untouched_state(clone) == before


def test_an_abbreviated_commit_id_is_resolved_and_pinned_in_full(tmp_path, cache):
    """``@d98e8a64``: git fetch takes only full ids, so the abbreviation is looked up in the
    objects at hand and the forecast (like the pin) names the full id, with no ref (issue 47, item 7)."""
    fork = make_fork(tmp_path)
    fork.stack([("keep-alpha", {A: replace_line("alpha line 10\n", "alpha line 10 fork\n")})])
    full = fork.upstream_commit({G: replace_line("gamma line 20\n", "gamma line 20 up\n")}, "up: gamma")
    data = forecast(fork.layout, f"git:{fork.upstream}@{full[:8]}")
    assert data["new_base"]["commit"] == full and "ref" not in data["new_base"]
    assert data["stack"]["patches"] == ["0001-keep-alpha.patch"]
    from tools.rebase.bump.prepare import resolve_spec

    pin = resolve_spec(fork.layout, f"git:{fork.upstream}@{full[:10]}")
    assert (pin.commit, pin.ref) == (full, "")
    missing = "0123456789abc"  # hex, but no commit of the upstream
    with pytest.raises(Exception, match=r"could not fetch '0123456789abc'.*give the full 40-hex id"):
        resolve_spec(fork.layout, f"git:{fork.upstream}@{missing}")
