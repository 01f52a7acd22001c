"""Issue 46: the committed records (``patches/proof.json`` and its mutant scores) are data a pull
request can forge or plant links for. Item 3: recording mutant scores writes through no committed
``proof.json.tmp`` link (every write goes through ``git/safefs.py``)."""

import os

from tests.tools.hostile import committed_fork, pull_request, tool


def test_recording_mutant_scores_writes_through_no_committed_temporary_link(tmp_path):
    from tools.rebase.git.paths import Layout
    from tools.rebase.proof.prove_mutants import MutantScore, write_mutant_record
    from tools.rebase.proof.record import stack_digest_now

    fork = committed_fork(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    ci = pull_request(fork, tmp_path, lambda pr: os.symlink(victim, pr / "patches" / "proof.json.tmp"))
    assert tool(ci, "apply", cache=tmp_path / "cache").returncode == 0
    layout = Layout(ci)
    score = MutantScore("keep-alpha")
    path = write_mutant_record(layout, [score], 1, 0, stack_digest_now(layout))
    assert victim.read_text() == "precious\n"
    assert path == ci / "patches" / "proof.json" and not path.is_symlink()
    assert '"keep-alpha"' in path.read_text()
