"""Issue 46, Low (in part): ``report --repo PATH`` reads a repository the tool did not make; its
own config and attributes can name a textconv and an external diff program that git would run on
every diff it shows. Every diffing git command of the tool (diff, log, show, format-patch,
range-diff) passes ``--no-textconv --no-ext-diff``; range-diff's own inner ``git log -p`` takes
neither, so every textconv the repository configures is pinned to ``cat`` for it."""

from tests.tools.bumpkit import commit, init, patch_msg, sh
from tools.rebase.analysis.classify import range_diff_pairs
from tools.rebase.analysis.diffparse import range_log
from tools.rebase.git.gitcmd import git


def test_the_tools_diffs_run_no_textconv_or_external_diff_of_the_repository(tmp_path):
    repo = tmp_path / "stacks"
    marker = tmp_path / "DRIVER-RAN"
    base = init(repo, {"a.py": "a = 1\n", ".gitattributes": "* diff=evil\n"})
    tip = commit(repo, {"a.py": "a = 2\n"}, patch_msg("p1"))
    sh("git", "config", "diff.evil.textconv", f"sh -c 'touch {marker}; cat \"$0\"'", cwd=repo)
    sh("git", "config", "diff.external", f"sh -c 'touch {marker}'", cwd=repo)
    sh("git", "log", "-p", "-1", cwd=repo)  # the repository's own git does run them
    assert marker.exists()
    marker.unlink()
    assert "+a = 2" in range_log(repo, base, tip)
    assert "+a = 2" in git("diff", base, tip, cwd=repo)
    assert "+a = 2" in git("show", tip, cwd=repo)
    assert "+a = 2" in git("format-patch", "--stdout", "-1", tip, cwd=repo)
    assert not marker.exists()


def test_range_diff_runs_no_textconv_of_the_repository(tmp_path):
    repo = tmp_path / "stacks"
    marker = tmp_path / "TEXTCONV-RAN"
    base = init(repo, {"a.py": "a = 1\n", ".gitattributes": "* diff=evil\n"})
    old = commit(repo, {"a.py": "a = 2\n"}, patch_msg("p1"))
    sh("git", "checkout", "-q", "-b", "other", base, cwd=repo)
    new = commit(repo, {"a.py": "a = 3\n"}, patch_msg("p1"))
    sh("git", "config", "diff.Evil.Driver.textconv", "true", cwd=repo)  # a second name, dotted
    sh("git", "config", "diff.evil.textconv", f"sh -c 'touch {marker}; cat \"$0\"'", cwd=repo)
    sh("git", "range-diff", f"{base}..{old}", f"{base}..{new}", cwd=repo)  # the repository's own git runs it
    assert marker.exists()
    marker.unlink()
    pairs, raw = range_diff_pairs(repo, f"{base}..{old}", f"{base}..{new}")
    assert pairs == [(0, 0)] and "p1" in raw
    assert not marker.exists()
