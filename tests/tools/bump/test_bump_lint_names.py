"""Post-merge lint finds what broke (issue 54, item 2): an undefined name a resolution left, a name
imported from the base that the base renamed, a call of a module function the base removed --
in every file a patch touches, before a stop is accepted. Only new problems count: the same
problem in upstream's own file on the new base does not stop the bump."""

import pytest

from tests.tools.bumpkit import make_fork, quiet, replace_line, sh
from tools.rebase.analysis.lint import lint_source
from tools.rebase.analysis.namecheck import top_level_names
from tools.rebase.bump import journal
from tools.rebase.bump.bump import Stopped, bump, bump_continue

HELPERS = "megatron/core/helpers.py"
MODEL = "megatron/core/model.py"
OTHER = "megatron/core/other.py"
FILES = {
    "megatron/core/package_info.py": "MAJOR = 0\nMINOR = 42\nPATCH = 1\n__version__ = '0.42.1'\n",
    "megatron/core/__init__.py": "",
    HELPERS: "def scale(x):\n    return 2 * x\n\n\ndef shift(x):\n    return x + 1\n",
    MODEL: ("from megatron.core.helpers import shift\n\n\n"
            "def forward(x):\n    y = shift(x)\n    return y\n"
            + "".join(f"\n\ndef unused_{i}():\n    return {i}\n" for i in range(20))),
    OTHER: ("import os\n\n\ndef where():\n    return os.getcwd()\n"
            + "".join(f"\n\ndef pad_{i}():\n    return {i}\n" for i in range(20))),
}


def passing(layout, name, ids):
    return {i: "passed" for i in ids}


@pytest.fixture
def fork(tmp_path, monkeypatch):
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache"))
    return make_fork(tmp_path, files=FILES)


def test_lint_source_reports_undefined_names_with_pyflakes():
    found = lint_source("m.py", "def f(x):\n    return x + missing_name\n")
    assert [(f.what, f.name) for f in found] == [("undefined", "missing_name")]
    assert "undefined name 'missing_name'" in str(found[0])


def test_top_level_names_are_read_statically():
    text = ("import os\nfrom a import b as c\nX = 1\nif os.name:\n    Y = 2\nelse:\n    def g(): pass\n"
            "try:\n    import z\nexcept ImportError:\n    z = None\nclass K: pass\n")
    assert top_level_names(text) == {"os", "c", "X", "Y", "g", "z", "K"}
    assert top_level_names("from x import *\n") is None  # anything may be there
    assert top_level_names("def __getattr__(name):\n    return 1\n") is None


def test_a_name_imported_from_a_base_that_renamed_it_stops_the_bump(fork):
    fork.stack([("use-scale", {OTHER: lambda t: t + "\n\nfrom megatron.core.helpers import scale\n\n\n"
                                                   "def doubled(x):\n    return scale(x)\n"})])
    # upstream renames scale (and fixes its own callers): the patch merges cleanly into a broken file
    fork.upstream_commit({HELPERS: replace_line("def scale(x):", "def scale_by_two(x):")},
                         "upstream: rename scale", tag="v2")
    with pytest.raises(Stopped) as stop:
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=passing)
    assert "imports 'scale' from megatron.core.helpers, which does not define it" in str(stop.value)
    j = journal.load(fork.layout)
    assert j.stopped.kind == "lint" and j.stopped.files == [OTHER]


def test_a_call_of_a_function_the_base_removed_stops_the_bump(fork):
    fork.stack([("call-shift", {OTHER: lambda t: t + "\n\nimport megatron.core.helpers as helpers\n\n\n"
                                                    "def moved(x):\n    return helpers.shift(x)\n"})])
    fork.upstream_commit({HELPERS: lambda t: t.split("\n\n\ndef shift")[0] + "\n",
                          MODEL: lambda t: t.replace("from megatron.core.helpers import shift\n", "")
                                            .replace("shift(x)", "x + 1")},
                         "upstream: drop shift", tag="v2")
    with pytest.raises(Stopped) as stop:
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=passing)
    assert "calls megatron.core.helpers.shift(), which does not exist" in str(stop.value)


def test_a_resolution_that_leaves_a_name_undefined_is_refused(fork):
    fork.stack([("forward-scale", {MODEL: replace_line("    y = shift(x)\n", "    y = shift(x) * 3\n")})])
    fork.upstream_commit({MODEL: replace_line("    y = shift(x)\n", "    z = shift(x)\n    y = z\n")},
                         "upstream: name the shifted value", tag="v2")
    with pytest.raises(Stopped, match="forward-scale"):
        bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=passing)
    text = (fork.work / MODEL).read_text()
    # the resolution takes upstream's new name but loses the line that assigns it
    resolved = text.split("<<<<<<<")[0] + "    y = z * 3\n" + text.split(">>>>>>>")[1].split("\n", 1)[1]
    (fork.work / MODEL).write_text(resolved)
    sh("git", "add", MODEL, cwd=fork.work)
    with pytest.raises(Stopped, match="undefined name 'z'"):
        bump_continue(fork.layout, log=quiet, test_runner=passing)
    (fork.work / MODEL).write_text(resolved.replace("    y = z * 3\n", "    z = shift(x)\n    y = z * 3\n"))
    sh("git", "add", MODEL, cwd=fork.work)
    data = bump_continue(fork.layout, log=quiet, test_runner=passing)
    assert not journal.journal_path(fork.layout).exists()
    assert data["counts"]


def test_problems_already_in_upstreams_file_do_not_stop_the_bump(fork):
    fork.stack([("touch-other", {OTHER: replace_line("    return os.getcwd()\n", "    return os.getcwd() + '/'\n")})])
    # upstream's own file is broken on the new base (an undefined name, an import of a name
    # helpers.py never had): upstream's problem, which the tests will name, not the merge's
    fork.upstream_commit({OTHER: lambda t: t + "\n\nfrom megatron.core.helpers import never_there\n\n\n"
                                               "def broken():\n    return not_defined_anywhere\n"},
                         "upstream: a broken module", tag="v2")
    data = bump(fork.layout, f"git:{fork.upstream}@v2", log=quiet, test_runner=passing)
    assert not journal.journal_path(fork.layout).exists()
    assert data["mapping"][0]["status"] in ("refreshed", "identical")
