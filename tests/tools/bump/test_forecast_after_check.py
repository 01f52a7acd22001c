"""Issue 46, Low: ``bump --dry-run`` on a fresh clone right after ``check`` (whose work repo holds
the built stack) forecasts, instead of refusing its own scratch work repo as unmarked."""

from tests.tools.bumpkit import replace_line
from tests.tools.hostile import committed_fork, pull_request, tool


def test_dry_run_after_check_on_a_fresh_clone(tmp_path):
    fork = committed_fork(tmp_path)
    fork.upstream_commit({"megatron/core/delta.py": replace_line("delta line 3\n", "delta line 3 v2\n")},
                         "v2", tag="v2")
    ci = pull_request(fork, tmp_path, lambda pr: None)
    proc = tool(ci, "check", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    proc = tool(ci, "bump", "--onto", f"git:{fork.upstream}@v2", "--dry-run", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert "keep-alpha" in proc.stdout
