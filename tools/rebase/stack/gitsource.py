"""The git kind of upstream base: the tool's cache repository of an upstream URL, the
``--mirror`` a maintainer names, fetching a pinned commit or a ref, and anchoring: a pinned commit
must be reachable from a branch or tag of the upstream repository (``require_anchored``).

Anchoring closes what the URL allow-list leaves open: GitHub serves every pull request's head
(``refs/pull/N/head``) and any fork's commit through the upstream URL, and the upstream repository
itself carries ``pull-request/*`` branches made from contributors' pull requests. A commit counts
only when a tag or a branch not made from a pull request (``ANCHOR_REFSPECS``) contains it; a maintainer may rehearse on
another commit with ``FORK_REBASE_ALLOW_UNANCHORED_PIN=1`` in the environment.
"""

import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.git import names
from tools.rebase.git.gitcmd import SHORT_ID_HINT, expand_short_id, git, git_proc, is_short_id, rev_parse
from tools.rebase.git.safefs import write_file

MIRROR_MARKER = "megatron-rebase-mirror"  # written by the tool into every cache repo it creates


def _mirror_purpose(url: str) -> str:
    return f"the cache repository of {url}"


@contextlib.contextmanager
def _git_cache(cache: Path, url: str):
    """The cache repo of ``url``, locked for this process (two cold applies share one key).

    It is made whole in a private folder (bare init, pinned attributes, the marker) and renamed
    into place, so a kill never leaves a half-made one. A folder at its name that the tool did not
    make is refused (another user's, or one a checkout carried, could hold hooks or config);
    an empty one (left by older versions killed mid-init) is taken as absent."""
    from tools.rebase.git.gitcmd import pin_attributes
    from tools.rebase.git.lock import key_locked
    from tools.rebase.git.owned import is_marked, mark
    from tools.rebase.git.safefs import makedirs

    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    folder = makedirs(cache, Path(cache) / "git")
    repo = folder / f"{key}.git"
    with key_locked(folder, key):
        if repo.is_dir() and not repo.is_symlink() and not any(repo.iterdir()):
            repo.rmdir()
        if not (repo.exists() or repo.is_symlink()):
            staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=folder))
            try:
                git("init", "-q", "--bare", staging, cwd=folder)
                pin_attributes(staging)
                mark(staging, MIRROR_MARKER, _mirror_purpose(url))
                os.rename(staging, repo)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        if not is_marked(repo, MIRROR_MARKER, _mirror_purpose(url)):
            raise RebaseError(f"{repo}: this cache repository was not created by tools.rebase for you "
                              f"(no valid {MIRROR_MARKER} marker owned by uid {os.getuid()}, or a link, "
                              f"or unpacked or copied from elsewhere); it is not used. Remove it and run again.")
        yield repo


# Canonical URL -> local git repository holding its objects (``bump --mirror PATH``): objects are
# fetched from the mirror, while pins, reports and cache keys keep the canonical URL.
MIRRORS = {}


def use_mirror(url: str, path) -> None:
    """Fetch ``url``'s objects from the local repository ``path`` in this process."""
    local = Path(path).expanduser()
    if not local.is_dir() or git_proc("rev-parse", "--git-dir", cwd=local).returncode != 0:
        raise RebaseError(f"--mirror {path}: not a git repository")
    MIRRORS[url] = str(local.resolve())


def _local_objects(url: str) -> str:
    """The object directory of the ``--mirror`` given for ``url``, else "".

    Only a mirror named on the command line is borrowed: a local path in the (untrusted) pin is
    fetched like any URL, so just the pinned history is copied and nothing else in it is linked.
    """
    if url not in MIRRORS:
        return ""
    proc = git_proc("rev-parse", "--absolute-git-dir", cwd=MIRRORS[url])
    if proc.returncode != 0:
        return ""
    objects = Path(proc.stdout.strip()) / "objects"
    return str(objects) if objects.is_dir() else ""


def _borrow(git_dir: Path, objects: str) -> None:
    """Let the repository at ``git_dir`` read ``objects`` in place (git alternates): importing a
    mirror's history then copies nothing. The mirror must stay where it is."""
    if not objects:
        return
    info = git_dir / "objects" / "info"
    info.mkdir(parents=True, exist_ok=True)
    alternates = info / "alternates"
    lines = alternates.read_text().splitlines() if alternates.is_file() else []
    if objects not in lines:
        write_file(git_dir, alternates, "".join(f"{line}\n" for line in [*lines, objects]))


def _local_url(url: str) -> str:
    if url in MIRRORS:
        return MIRRORS[url]
    path = Path(url).expanduser()
    return str(path.resolve()) if path.exists() else url


def resolve_git_ref(cache: Path, url: str, ref: str) -> str:
    """Fetch ``ref`` from ``url`` into the cache mirror and return its full commit id."""
    names.git_url(url, "git source")
    names.git_ref(ref, f"git source {url}")
    with _git_cache(cache, url) as mirror:
        _borrow(mirror, _local_objects(url))
        proc = git_proc("fetch", "-q", "--no-tags", "--", _local_url(url), ref, cwd=mirror)
        full = None
        if proc.returncode != 0:  # fetch takes full ids only: look an abbreviation up in the objects at hand
            full = expand_short_id([mirror, Path(_local_url(url))], ref)
            if full:
                proc = git_proc("fetch", "-q", "--no-tags", "--", _local_url(url), full, cwd=mirror)
        if proc.returncode != 0:
            hint = SHORT_ID_HINT if is_short_id(ref) and not full else ""
            raise RebaseError(f"could not fetch {ref!r} from {url}: {proc.stderr.strip()}{hint}")
        commit = rev_parse(mirror, "FETCH_HEAD")
        if not commit:
            raise RebaseError(f"{url}: {ref!r} does not name a commit")
        git("update-ref", f"refs/upstream-history/{commit}", commit, cwd=mirror)
    return commit


def git_tree_digest(cache: Path, url: str, commit: str) -> str:
    """The tree digest (stack/archive.py) of ``commit``, which ``resolve_git_ref`` brought into the cache."""
    from tools.rebase.stack.archive import commit_tree_digest

    with _git_cache(cache, url) as mirror:
        return commit_tree_digest(mirror, commit)


def fetch_git_commit(work: Path, cache: Path, url: str, commit: str, network: bool = True) -> str:
    """Bring ``commit`` (with history) from ``url`` into ``work``; verify it exists. Without
    ``network``, "" when only a remote fetch would bring it (the caller takes an archive)."""
    if not rev_parse(work, commit):
        names.git_url(url, "git source")
        with _git_cache(cache, url) as mirror:
            local_objects = _local_objects(url)
            _borrow(mirror, local_objects)
            _borrow(work / ".git", local_objects)
            if not rev_parse(mirror, commit):
                if not network and url not in MIRRORS and not names.is_local_path(url):
                    return ""
                proc = git_proc("fetch", "-q", "--no-tags", "--", _local_url(url), commit, cwd=mirror)
                if proc.returncode != 0 or not rev_parse(mirror, commit):
                    raise RebaseError(
                        f"could not fetch commit {commit} from {url}: {proc.stderr.strip() or 'not found'}"
                    )
                git("update-ref", f"refs/upstream-history/{commit}", commit, cwd=mirror)
            git("fetch", "-q", "--no-tags", "--", str(mirror), f"+{commit}:refs/upstream-history/{commit}",
                cwd=work)
    git("update-ref", f"refs/upstream-history/{commit}", commit, cwd=work)
    return commit


ALLOW_UNANCHORED_ENV = "FORK_REBASE_ALLOW_UNANCHORED_PIN"
ANCHORS = "refs/upstream-anchors/"
# The upstream refs that anchor a pin: branches and tags, never a branch made from a pull request
# (the pull-request/* branches CI copies contributors' heads to, GitHub's merge-queue branches
# gh-readonly-queue/*) nor GitHub's refs/pull/* (not under heads or tags at all).
ANCHOR_REFSPECS = (f"+refs/heads/*:{ANCHORS}heads/*", "^refs/heads/pull-request/*",
                   "^refs/heads/gh-readonly-queue/*", f"+refs/tags/*:{ANCHORS}tags/*")


def _anchor_of(repo: Path, commit: str) -> str:
    """The first anchor ref of ``repo`` that contains ``commit``, else ""."""
    if not rev_parse(repo, f"{commit}^{{commit}}"):
        return ""
    proc = git_proc("for-each-ref", "--count=1", "--contains", commit, "--format=%(refname)", ANCHORS, cwd=repo)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def require_anchored(cache: Path, url: str, commit: str, log=None) -> str:
    """The upstream ref (branch or tag) that contains ``commit``; an error when none does.

    The refs are fetched from ``url`` (or from its ``--mirror``) into the cache repository under
    ``refs/upstream-anchors/`` (pruned, so a deleted branch anchors nothing), and a commit a
    fetched ref already contains is not fetched for again. With
    ``FORK_REBASE_ALLOW_UNANCHORED_PIN=1`` an unanchored commit is let through with a warning."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    names.git_url(url, "git source")
    with _git_cache(cache, url) as mirror:
        _borrow(mirror, _local_objects(url))
        found = _anchor_of(mirror, commit)
        if not found:
            proc = git_proc("fetch", "-q", "--no-tags", "--prune", "--", _local_url(url), *ANCHOR_REFSPECS,
                            cwd=mirror)
            if proc.returncode != 0 and os.environ.get(ALLOW_UNANCHORED_ENV) == "1":
                log(f"warning: could not fetch the branches and tags of {url} ({proc.stderr.strip()}); commit "
                    f"{commit} used unanchored because {ALLOW_UNANCHORED_ENV}=1 (a rehearsal)")
                return ""
            if proc.returncode != 0:
                raise RebaseError(f"could not fetch the branches and tags of {url} to check that commit "
                                  f"{commit} is upstream's: {proc.stderr.strip()}")
            found = _anchor_of(mirror, commit)
    if found:
        return found[len(ANCHORS):]
    if os.environ.get(ALLOW_UNANCHORED_ENV) == "1":
        log(f"warning: commit {commit} is on no branch or tag of {url}; used anyway because "
            f"{ALLOW_UNANCHORED_ENV}=1 (a rehearsal: never for a pull request's pin)")
        return ""
    raise RebaseError(
        f"commit {commit} is on no branch or tag of {url} (pull-request/* and gh-readonly-queue/* branches and "
        f"refs/pull/* do not count): a pin must name upstream's own history, since GitHub serves any pull request's or fork's "
        f"commit through the upstream URL; nothing was imported. A maintainer may rehearse on such a commit "
        f"with {ALLOW_UNANCHORED_ENV}=1 in the environment")
