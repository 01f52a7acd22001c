"""Issue 46, item 4: the commands docs/security.md says run none of a pull request's code
(``apply``, ``check``, ``list``, ``report``, ``bump --dry-run``, ``pip install .``) run none. The
pull request commits, wherever Python, pytest, pip or the tool could pick one up, a file that
writes a marker when it runs: ``sitecustomize.py``, ``usercustomize.py``, a ``.pth``, ``conftest.py``
(top level, ``tests/``, ``patches/``) and a shadow of the tool itself (``tools/rebase``)."""

import pytest

from tests.tools.hostile import pull_request, tool
from tests.tools.test_hostile_pr_build import buildable_fork, pip_wheel

PLANTED = ("sitecustomize.py", "usercustomize.py", "conftest.py", "tests/conftest.py", "patches/conftest.py",
           "patches/sitecustomize.py", "tools/__init__.py", "tools/rebase/__init__.py", "tools/rebase/__main__.py",
           "tools/rebase/cli.py", "megatron_fork_evil.pth")


def _plant(markers):
    def payload(pr):
        for rel in PLANTED:
            if rel.startswith("tools/") and (pr / rel).exists():
                continue  # the buildable fork carries the maintainer's tools/: that is code, not data
            marker = markers / rel.replace("/", "_")
            code = f"open({str(marker)!r}, 'w').write('ran')\n"
            if rel.endswith(".pth"):
                code = f"import builtins; {code}"
            (pr / rel).parent.mkdir(parents=True, exist_ok=True)
            (pr / rel).write_text(code)
    return payload


@pytest.fixture
def planted(tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    fork = buildable_fork(tmp_path)
    fork.upstream_commit({"megatron/core/delta.py": "delta v2\n"}, "v2", tag="v2")
    return fork, pull_request(fork, tmp_path, _plant(markers)), markers


COMMANDS = {
    "apply": (("apply",), True),
    "check": (("check",), True),
    "list": (("list",), True),
    "report": (("report",), False),  # there may be no bump to report on: it still runs nothing
    "bump --dry-run": (("bump", "--onto", "git:{upstream}@v2", "--dry-run"), True),
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_data_only_pull_request_runs_nothing_under(planted, tmp_path, name):
    fork, ci, markers = planted
    args, must_pass = COMMANDS[name]
    args = [a.format(upstream=fork.upstream) for a in args]
    if name != "apply":
        assert tool(ci, "apply", cache=tmp_path / "cache").returncode == 0
    proc = tool(ci, *args, cache=tmp_path / "cache")
    assert proc.returncode == 0 or not must_pass, proc.stderr
    assert sorted(p.name for p in markers.iterdir()) == []


def test_a_data_only_pull_request_runs_nothing_under_pip_install(planted, tmp_path):
    fork, ci, markers = planted
    proc, wheels = pip_wheel(ci, tmp_path)
    assert proc.returncode == 0 and wheels, proc.stderr[-3000:]
    assert sorted(p.name for p in markers.iterdir()) == []
