"""Git operations on the work repo's commits that the bump phases share: read patch commits,
commit a pick, rewrite a chain reproducibly, reset after a stop. Private to the bump package
(names keep their leading underscore)."""

from pathlib import Path

from tools.rebase.bump import rerere_store as rr
from tools.rebase.git.gitcmd import git, git_proc, head_commit
from tools.rebase.stack.stack import chain_log, commit_message


def _unmerged(work: Path) -> list:
    out = git("diff", "--name-only", "--diff-filter=U", cwd=work)
    return sorted(set(out.split()))


def _marker_files(work: Path) -> list:
    """Staged files that still carry conflict markers."""
    out = git("diff", "--cached", "--no-color", "-U0", cwd=work)
    bad, current = set(), None
    for line in out.splitlines():
        if line.startswith("+++ b/"):
            current = line[6:]
        elif line.startswith(("+<<<<<<< ", "+>>>>>>> ")) and current:
            bad.add(current)
    return sorted(bad)


def _staged_changes(work: Path) -> bool:
    return git_proc("diff", "--cached", "--quiet", cwd=work).returncode != 0


def _commit_pick(work: Path, original: str, date: str) -> str:
    """Commit the staged result as the replay of ``original`` (committer date = author date, so
    the id is the one ``apply`` builds from the exported patch)."""
    git("commit", "-q", "--no-verify", "--allow-empty-message", "-C", original, cwd=work,
        env={"GIT_COMMITTER_DATE": date})
    return git("rev-parse", "HEAD", cwd=work).strip()


def _describe(work: Path, base: str, tip: str):
    """``[(commit, Patch-Name or short id, raw author date)]`` of base..tip, in one git call."""
    from tools.rebase.stack.series import parse_trailers

    rows = []
    for c in chain_log(work, base, tip):
        names = parse_trailers(c.message).get("Patch-Name", [])
        rows.append((c.commit, names[0] if names else c.commit[:12], c.author_date))
    return rows


def _recommit(work: Path, commit: str, parent: str, original: str, keep_message: bool,
              move_head: bool = True) -> str:
    """Rewrite ``commit`` onto ``parent`` with ``original``'s author (and message unless
    ``keep_message``), committer date = author date; move HEAD there (same tree: no checkout)."""
    fields = git("show", "-s", "--date=raw", "--format=%an%x00%ae%x00%ad", original, cwd=work).strip("\n")
    name, email, date = fields.split("\x00")
    message = commit_message(work, commit if keep_message else original).rstrip("\n") + "\n"
    tree = git("rev-parse", f"{commit}^{{tree}}", cwd=work).strip()
    env = {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_AUTHOR_DATE": date,
           "GIT_COMMITTER_DATE": date}
    new = git("commit-tree", tree, "-p", parent, "-F", "-", cwd=work, env=env, input=message).strip()
    if move_head:
        git("reset", "-q", "--soft", new, cwd=work)
    return new


def canonical_chain(work: Path, base: str, tip: str) -> str:
    """Make every commit of base..tip reproducible (tool committer, committer date = author date),
    rewriting from the first one that is not (e.g. amended by hand); return the new tip. Only
    objects are written: HEAD and branches stay (a bump may not touch them before its backup)."""
    from tools.rebase.git.gitcmd import COMMITTER_EMAIL, COMMITTER_NAME

    parent, dirty = base, False
    for c in chain_log(work, base, tip):
        dirty = dirty or (c.committer_name, c.committer_email, c.committer_date) != \
            (COMMITTER_NAME, COMMITTER_EMAIL, c.author_date)
        parent = _recommit(work, c.commit, parent, c.commit, keep_message=True, move_head=False) \
            if dirty else c.commit
    return parent


def _to_branch(work: Path, tip: str) -> None:
    """Put the work repo on branch ``patched`` at ``tip`` (HEAD is there already: no checkout)."""
    if _head(work) != tip:
        git("checkout", "-q", "-f", "--detach", tip, cwd=work)
    git("update-ref", "refs/heads/patched", tip, cwd=work)
    git("symbolic-ref", "HEAD", "refs/heads/patched", cwd=work)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def _head(work: Path) -> str:
    """HEAD's commit id, read without a git process when the files hold it plainly."""
    return head_commit(work) or git("rev-parse", "HEAD", cwd=work).strip()


def _reset_to(work: Path, commit: str) -> None:
    rr.forget_in_progress(work)  # first: `cherry-pick --quit` deletes MERGE_RR, which rerere clear reads
    for args in (("cherry-pick", "--quit"), ("merge", "--quit")):
        git_proc(*args, cwd=work)
    git("reset", "-q", "--hard", commit, cwd=work)
    git("clean", "-q", "-fd", cwd=work)


def _patch_name(work: Path, commit: str) -> str:
    from tools.rebase.stack.series import parse_trailers

    names = parse_trailers(commit_message(work, commit)).get("Patch-Name", [])
    return names[0] if names else commit[:12]


def _subject(work: Path, commit: str) -> str:
    return git("show", "-s", "--format=%s", commit, cwd=work).strip()


def _tests_of(work: Path, commit: str) -> list:
    from tools.rebase.stack.series import parse_trailers, test_ids

    return test_ids(parse_trailers(commit_message(work, commit)))


def _files_of(work: Path, commit: str) -> list:
    return git("diff-tree", "--no-commit-id", "--name-only", "-r", commit, cwd=work).split()
