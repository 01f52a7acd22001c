"""``publish`` writes a line as a branch of the checkout's repository (upstream's commit, then one
commit per patch with its message and trailers), reproducibly; ``check --published`` verifies one
(issue 58, item 2)."""

from tests.tools.bumpkit import sh
from tests.tools.linekit import DEV_STACK, RELEASE_STACK, fork_with_dev_line
from tests.tools.sdists import write_sdist
from tools.rebase.cli import main
from tools.rebase.stack.series import load_stack
from tools.rebase.stack.stack import export_range


def log(repo, spec):
    return sh("git", "log", "--format=%s", "--reverse", spec, cwd=repo).splitlines()


def test_a_published_line_is_upstreams_commit_then_its_patches(tmp_path, cache, capsys):
    fork, line, dev = fork_with_dev_line(tmp_path)
    assert main(["-C", str(fork.root), "publish", "--line", "dev"]) == 0
    tip = sh("git", "rev-parse", "line/dev", cwd=fork.root).strip()
    # `git log <upstream commit>..<branch>` is the series, in order, one commit per patch.
    assert log(fork.root, f"{dev}..line/dev") == [name for name, _ in DEV_STACK]
    chain = sh("git", "rev-list", "--first-parent", "line/dev", cwd=fork.root).split()
    assert chain[len(DEV_STACK)] == dev and chain[0] == tip
    # Each commit is its patch: exporting the branch gives the line's patch files byte for byte
    # (message, trailers, author, date, diff); each has one parent; the tip's tree is the work repo's.
    exported = export_range(fork.root, dev, "line/dev")
    _, patches = load_stack(line.layout)
    assert [(name, data) for name, data in exported] == [(p.path.name, p.path.read_bytes()) for p in patches]
    for published in chain[:len(DEV_STACK)]:
        assert len(sh("git", "rev-list", "--parents", "-1", published, cwd=fork.root).split()) == 2
    work_tip = sh("git", "rev-parse", "HEAD^{tree}", cwd=line.work).strip()
    assert sh("git", "rev-parse", "line/dev^{tree}", cwd=fork.root).strip() == work_tip
    assert "beta line 5 dev" in sh("git", "show", "line/dev:megatron/core/beta.py", cwd=fork.root)
    assert "nothing was pushed" in capsys.readouterr().out
    # check --published passes on it.
    assert main(["-C", str(fork.root), "check", "--line", "dev", "--published", "line/dev"]) == 0


def test_publishing_is_reproducible_on_another_machine(tmp_path, cache, monkeypatch):
    fork, line, dev = fork_with_dev_line(tmp_path)
    first = publish_tip(fork.root, "dev")
    assert publish_tip(fork.root, "dev") == first  # again: nothing changes
    clone = tmp_path / "elsewhere"
    sh("git", "clone", "-q", str(fork.root), str(clone), cwd=tmp_path)
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "other-cache"))
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    assert publish_tip(clone, "dev") == first


def publish_tip(root, line):
    assert main(["-C", str(root), "publish", "--line", line]) == 0
    return sh("git", "rev-parse", f"line/{line}", cwd=root).strip()


def test_check_published_names_what_differs(tmp_path, cache, capsys):
    fork, line, dev = fork_with_dev_line(tmp_path)
    publish_tip(fork.root, "dev")
    capsys.readouterr()
    # The same patches, but the last commit's message edited: its patch is named.
    sh("git", "branch", "edited", "line/dev", cwd=fork.root)
    sh("git", "checkout", "-q", "edited", cwd=fork.root)
    sh("git", "commit", "-q", "--amend", "-m", "beta-dev, reworded", cwd=fork.root)
    sh("git", "checkout", "-q", "main", cwd=fork.root)
    assert main(["-C", str(fork.root), "check", "--line", "dev", "--published", "edited"]) == 1
    err = capsys.readouterr().err
    assert "edited: the commit of 'beta-dev' is" in err
    # A branch on another upstream commit: the first-parent root is named.
    assert main(["-C", str(fork.root), "check", "--line", "dev", "--published", "main"]) == 1
    assert "do not sit on upstream" in capsys.readouterr().err
    assert main(["-C", str(fork.root), "check", "--line", "dev", "--published", "nope"]) == 1
    assert "no such branch" in capsys.readouterr().err


def test_publish_never_replaces_a_branch_of_your_own_without_force(tmp_path, cache, capsys):
    fork, line, dev = fork_with_dev_line(tmp_path)
    mine = sh("git", "rev-parse", "main", cwd=fork.root).strip()
    sh("git", "branch", "mine", cwd=fork.root)
    assert main(["-C", str(fork.root), "publish", "--line", "dev", "--branch", "mine"]) == 2
    assert "exists at" in capsys.readouterr().err
    assert sh("git", "rev-parse", "mine", cwd=fork.root).strip() == mine
    assert main(["-C", str(fork.root), "publish", "--line", "dev", "--branch", "main", "--force"]) == 2
    assert "checked out" in capsys.readouterr().err
    assert main(["-C", str(fork.root), "publish", "--line", "dev", "--branch", "mine", "--force"]) == 0
    assert log(fork.root, f"{dev}..mine") == [name for name, _ in DEV_STACK]
    assert main(["-C", str(fork.root), "publish", "--line", "dev", "--branch=bad..name"]) == 2
    assert "bad..name" in capsys.readouterr().err


def test_the_release_line_publishes_on_a_commit_of_the_sdists_tree(tmp_path, find_links, cache, capsys):
    """A sdist pin has no upstream commit: the branch's root is the parentless commit of the
    verified sdist's tree that apply imports (the same on every machine)."""
    fork, line, dev = fork_with_dev_line(tmp_path)
    files = {"pyproject.toml": "[project]\nname = 'megatron-core'\nversion = '0.42.1'\n",
             "megatron/core/package_info.py": "MAJOR = 0\nMINOR = 42\nPATCH = 1\nPRE_RELEASE = ''\n",
             "megatron/core/alpha.py": "".join(f"alpha line {i}\n" for i in range(1, 41)), "PKG-INFO": "x\n"}
    sha = write_sdist(find_links / "megatron_core-0.42.1.tar.gz", "megatron_core-0.42.1", files)
    (fork.root / "upstream.toml").write_text(
        f'[upstream]\nkind = "pypi"\npackage = "megatron-core"\nversion = "0.42.1"\nsha256 = "{sha}"\n')
    sh("git", "commit", "-qam", "release line on the sdist", cwd=fork.root)
    assert main(["-C", str(fork.root), "publish", "--force"]) == 0
    chain = sh("git", "rev-list", "--first-parent", "line/release", cwd=fork.root).split()
    assert len(chain) == len(RELEASE_STACK) + 1
    root = chain[-1]
    assert sh("git", "show", "-s", "--format=%s", root, cwd=fork.root).strip() == "Upstream megatron-core 0.42.1"
    listed = sh("git", "ls-tree", "-r", "--name-only", root, cwd=fork.root).split()
    assert sorted(listed) == sorted(n for n in files if n != "PKG-INFO")
    assert log(fork.root, f"{root}..line/release") == [name for name, _ in RELEASE_STACK]
    assert main(["-C", str(fork.root), "check", "--published", "line/release"]) == 0
