"""A clean merge into dead code is flagged (issue 54, item 5): a patch whose hunks all land in a
module nobody imports any more, or a function nothing references any more, is reported
"unreached" (with the unit and why), not "identical"/"renumbered"; one whose code is still
reached is not."""

import json

import pytest

from tests.tools.bumpkit import UPSTREAM_FILES, make_fork, quiet, replace_line
from tools.rebase.bump.bump import bump

FEATURE, USER, OTHER = "megatron/core/feature.py", "megatron/core/user.py", "megatron/core/other_user.py"
FILES = {
    **UPSTREAM_FILES,
    FEATURE: "def helper_scale(x):\n    return x * 2\n\n\ndef helper_shift(x):\n    return x + 1\n",
    USER: "from megatron.core.feature import helper_scale, helper_shift\n\n\ndef run(x):\n"
          "    return helper_shift(helper_scale(x))\n",
}


def runner(layout, name, ids):
    return {i: "passed" for i in ids}


@pytest.fixture
def fork(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    fork = make_fork(tmp_path, files=FILES)
    fork.stack([("scale-fix", {FEATURE: replace_line("    return x * 2\n", "    return x * 3\n")}),
                ("shift-fix", {FEATURE: replace_line("    return x + 1\n", "    return x + 2\n")})])
    return fork


def _statuses(fork):
    bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=runner)
    data = json.loads(fork.layout.report_json.read_text())
    return {e["patch_name"]: e for e in data["mapping"]}, fork.layout.report_md.read_text()


def test_a_module_nobody_imports_any_more_is_flagged(fork):
    fork.upstream_commit({USER: "def run(x):\n    return (x * 2) + 1\n"}, "upstream: inline the helpers", tag="v2")
    entries, md = _statuses(fork)
    for name in ("scale-fix", "shift-fix"):
        assert entries[name]["status"] == "unreached", entries[name]
        assert f"module {FEATURE} (no import of it left)" in entries[name]["note"]
    assert "**Unreached**: 2 patch(es)" in md


def test_a_function_without_callers_is_flagged_and_a_called_one_is_not(fork):
    fork.upstream_commit({USER: "from megatron.core.feature import helper_shift\n\n\ndef run(x):\n"
                                "    return helper_shift(x * 2)\n"}, "upstream: stop calling helper_scale", tag="v2")
    entries, _ = _statuses(fork)
    assert entries["scale-fix"]["status"] == "unreached"
    assert entries["scale-fix"]["was"] in ("identical", "renumbered", "refreshed")
    assert f"function helper_scale in {FEATURE} (no reference left)" in entries["scale-fix"]["note"]
    assert entries["shift-fix"]["status"] != "unreached"


def test_code_still_reached_from_a_new_importer_is_not_flagged(fork):
    fork.upstream_commit({USER: "def run(x):\n    return x\n",
                          OTHER: "from megatron.core import feature\n\n\ndef go(x):\n"
                                 "    return feature.helper_shift(feature.helper_scale(x))\n"},
                         "upstream: move the caller", tag="v2")
    entries, md = _statuses(fork)
    assert {e["status"] for e in entries.values()} & {"unreached"} == set()
    assert "Unreached" not in md
