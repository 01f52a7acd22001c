"""``apply``, ``check`` and ``prove`` with ``--mirror PATH``: a line pinned to a repository this
machine cannot reach (upstream ``main`` where only a local clone of it is at hand) is built from
the clone's objects, while its pin keeps naming the real URL and commit."""

import pytest

from tests.tools.bumpkit import add_line, replace_line, sh
from tools.rebase.cli import main
from tools.rebase.stack import gitsource

ALPHA = "megatron/core/alpha.py"


@pytest.fixture(autouse=True)
def no_leftover_mirrors(monkeypatch):
    monkeypatch.setattr(gitsource, "MIRRORS", {})


def unreachable_line(fork, tmp_path):
    """Line ``next``: one patch on the fork's upstream v1, then its pin pointed at a URL that does
    not exist (same commit), with its work repo and the download cache gone: a fresh machine."""
    line = add_line(fork, "next")
    line.stack([("alpha-seventy", {ALPHA: replace_line("return 7\n", "return 70\n")})])
    commit = sh("git", "rev-parse", "v1", cwd=fork.upstream).strip()
    url = str(tmp_path / "nowhere" / "Megatron-LM.git")
    line.layout.pin.write_text(f'[upstream]\nkind = "git"\nurl = "{url}"\ncommit = "{commit}"\n')
    sh("rm", "-rf", str(fork.root / ".rebase"), str(fork.root / "megatron"), str(tmp_path / "cache"), cwd=tmp_path)
    return line


def test_apply_of_an_unreachable_pin_needs_the_mirror_and_works_with_it(fork, tmp_path, capsys):
    line = unreachable_line(fork, tmp_path)
    assert main(["-C", str(fork.root), "apply", "--line", "next"]) == 2
    assert "nowhere" in capsys.readouterr().err
    assert not (fork.root / ALPHA).exists()
    assert main(["-C", str(fork.root), "apply", "--line", "next", "--mirror", str(fork.upstream)]) == 0
    assert "return 70" in (fork.root / ALPHA).read_text()
    assert "nowhere" in line.layout.pin.read_text()  # the pin still names the real URL
    assert main(["-C", str(fork.root), "check", "--line", "next", "--mirror", str(fork.upstream)]) == 0


def test_check_of_an_unreachable_pin_on_a_fresh_machine_needs_the_mirror(fork, tmp_path, capsys):
    """check imports the base itself (no earlier apply): without --mirror it cannot, with it it passes."""
    unreachable_line(fork, tmp_path)
    assert main(["-C", str(fork.root), "check", "--line", "next"]) == 1  # a problem found, not a usage error
    assert "nowhere" in capsys.readouterr().err
    assert main(["-C", str(fork.root), "check", "--line", "next", "--mirror", str(fork.upstream)]) == 0
    assert "check: ok" in capsys.readouterr().out


def test_prove_of_an_unreachable_pin_runs_with_the_mirror(fork, tmp_path, capsys):
    unreachable_line(fork, tmp_path)
    (fork.root / "tests" / "test_dummy.py").write_text(
        "from megatron.core.alpha import alpha_7\n\n\ndef test_ok():\n    assert alpha_7() == 70\n")
    code = main(["-C", str(fork.root), "prove", "--line", "next", "--mirror", str(fork.upstream)])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert "alpha-seventy" in out.out and "proven" in out.out


def test_mirror_is_refused_where_it_cannot_serve(fork, tmp_path, capsys):
    unreachable_line(fork, tmp_path)
    not_a_repo = tmp_path / "plain-folder"
    not_a_repo.mkdir()
    assert main(["-C", str(fork.root), "apply", "--line", "next", "--mirror", str(not_a_repo)]) == 2
    assert "not a git repository" in capsys.readouterr().err
    assert main(["-C", str(fork.root), "check", "--line", "next", "--no-base", "--mirror", str(fork.upstream)]) == 2
    assert "--mirror and --no-base" in capsys.readouterr().err
    fork.layout.pin.write_text('[upstream]\nkind = "pypi"\npackage = "megatron-core"\nversion = "0.19.2"\n'
                               f'sha256 = "{"0" * 64}"\n')
    assert main(["-C", str(fork.root), "apply", "--mirror", str(fork.upstream)]) == 2
    assert 'upstream.toml pins kind = "pypi"' in capsys.readouterr().err
