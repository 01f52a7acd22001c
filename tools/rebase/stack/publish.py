"""Publish a line as a branch of the checkout's own repository: upstream's commit, then one commit
per patch, in series order, each with its patch's message and trailers.

This is the form RL teams install and read a fork in (``pip install git+URL@BRANCH``, ``git log``):
the branch's tree is upstream's tree with the patches, installed by upstream's own packaging. It is
made as ``apply`` makes the work repo's commits (``git am`` of each patch file, the tool's fixed
committer, the patch's author and date), but on the real upstream commit (a git pin) or on the
base commit of the sdist's tree (a sdist pin). So publishing twice, anywhere, gives the same ids,
and ``check --published`` recomputes them to compare.
"""

from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import git, git_proc, rev_parse
from tools.rebase.stack.pin import load_pin
from tools.rebase.stack.state import read_state

PUBLISH_REF = "refs/published/tip"  # in the work repo: what the checkout's repository fetches


def default_branch(layout) -> str:
    return f"line/{layout.line or 'release'}"


def upstream_commit(layout) -> str:
    """The published branch's root: the pinned upstream commit itself (a git pin; ``apply`` has
    fetched it into the work repo) or the base commit holding the pinned sdist's tree."""
    pin = load_pin(layout.pin)
    base = read_state(layout).get("base", "")
    if pin.kind != "git":
        return base
    if not rev_parse(layout.work, pin.commit):
        raise RebaseError(f"{pin.commit}: the pinned upstream commit is not in {layout.work} (applied from an "
                          f"archive?); publish needs its history: pass --mirror PATH or let it be fetched")
    return pin.commit


def published_commits(layout) -> list:
    """Build, in the work repo, the branch's commits: the series applied on the upstream commit
    as ``apply`` applies it (``git am``, the tool's fixed committer, dates from the patches), so
    the ids depend on the patch files and the pin alone, never on the work repo's own history.
    Returns ``[(patch name, commit)]`` in series order."""
    from tools.rebase.stack.series import load_stack
    from tools.rebase.stack.stack import build

    if not read_state(layout).get("base"):
        raise RebaseError(f"{layout.work}: no applied stack; run `python -m tools.rebase apply{layout.line_flag}`")
    _, patches = load_stack(layout)
    commits = build(layout.work, upstream_commit(layout), [p.path for p in patches], three_way=True)
    return [(p.name, c) for p, c in zip(patches, commits)]


def checkout_repository(layout) -> Path:
    proc = git_proc("rev-parse", "--absolute-git-dir", cwd=layout.root)
    if proc.returncode != 0:
        raise RebaseError(f"{layout.root}: not a git repository; publish writes a branch of the checkout's own "
                          f"repository")
    return Path(proc.stdout.strip())


def publish(layout, branch: str, force: bool = False, log=print) -> str:
    """Write ``branch`` in the checkout's repository (never pushed); return its tip. An existing
    branch holding something else is replaced only with ``force``; the branch checked out never."""
    from tools.rebase.git.names import git_ref

    git_ref(branch, "--branch")
    if git_proc("check-ref-format", f"refs/heads/{branch}", cwd=layout.root).returncode != 0:
        raise RebaseError(f"--branch {branch!r}: not a valid branch name")
    repo = checkout_repository(layout)
    commits = published_commits(layout)
    root = upstream_commit(layout)
    tip = commits[-1][1] if commits else root
    current = rev_parse(layout.root, f"refs/heads/{branch}")
    if current == tip:
        log(f"{branch} is already {tip[:12]}: {len(commits)} patch commit(s) on {root[:12]}")
        return tip
    head = git_proc("symbolic-ref", "-q", "HEAD", cwd=layout.root).stdout.strip()
    if head == f"refs/heads/{branch}":
        raise RebaseError(f"{branch} is the branch checked out in {layout.root}; publish to another branch")
    if current and not force:
        raise RebaseError(f"{branch} exists at {current[:12]}, not the published {tip[:12]}; pass --force to "
                          f"replace it (a branch of your own is never replaced silently)")
    git("update-ref", PUBLISH_REF, tip, cwd=layout.work)
    git("fetch", "-q", "--no-tags", "--no-write-fetch-head", "--", str(layout.work),
        f"+{PUBLISH_REF}:refs/heads/{branch}", cwd=repo)
    log(f"published {branch} = {tip[:12]}: {len(commits)} patch commit(s) on upstream {root[:12]} "
        f"(in {repo}; nothing was pushed)")
    return tip


def verify_published(layout, branch: str) -> list:
    """Problems of ``branch`` against the series: it must be exactly what ``publish`` writes."""
    commits = published_commits(layout)
    root = upstream_commit(layout)
    actual = rev_parse(layout.root, f"refs/heads/{branch}") or rev_parse(layout.root, branch)
    if not actual:
        return [f"--published {branch}: no such branch in {layout.root}"]
    expected = commits[-1][1] if commits else root
    if actual == expected:
        return []
    chain = git("rev-list", "--first-parent", f"--max-count={len(commits) + 1}", actual, cwd=layout.root).split()
    chain.reverse()
    problems = []
    if len(chain) != len(commits) + 1 or chain[0] != root:
        problems.append(f"{branch}: its first {len(commits)} commit(s) do not sit on upstream {root[:12]} "
                        f"({len(commits)} patch(es) in the series)")
    for (name, published), found in zip(commits, chain[1:]):
        if found != published:
            problems.append(f"{branch}: the commit of {name!r} is {found[:12]}, not {published[:12]} (its tree, "
                            f"message, author or parent differs from the series)")
            break
    return problems or [f"{branch} is at {actual[:12]}, not the published {expected[:12]}"]
