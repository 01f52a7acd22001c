"""Run git hermetically: no user or system config, fixed locale and committer identity.

Export output and commit ids must not depend on whoever runs the tool (rebase-tool-anchors,
experiments 7 and 8), so every call goes through here.
"""

import os
import subprocess
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.git.safefs import write_file

COMMITTER_NAME = "Megatron RL fork tooling"
COMMITTER_EMAIL = "rebase@megatron-rl-fork.invalid"

_ATTRIBUTES = Path(__file__).with_name("gitattributes")

# Settings that change format-patch/diff output or commit ids when a user sets them.
_PINNED_CONFIG = {
    "core.autocrlf": "false",
    "core.attributesFile": str(_ATTRIBUTES),
    "core.quotePath": "true",
    # Files and programs git would otherwise pick up from the user's home: a personal ignore file
    # hides untracked work from the clean checks, fsmonitor runs a program, and remote helpers like
    # ext:: run commands named in a URL. Hooks never run: a repository the tool did not fill itself
    # (a committed cache repo) would otherwise run its hooks/ (HOOKS_ENV, set by whoever starts
    # the tool, names a hooks folder for tests).
    "core.hooksPath": "/nonexistent/megatron-rebase-hooks",
    "core.excludesFile": os.devnull,
    "core.fsmonitor": "false",
    "protocol.ext.allow": "never",
    "protocol.fd.allow": "never",
    "diff.noprefix": "false",
    "diff.mnemonicPrefix": "false",
    "diff.algorithm": "myers",
    "diff.context": "3",
    "diff.interHunkContext": "0",
    "diff.orderFile": "/dev/null",
    "diff.relative": "false",
    "diff.renames": "true",
    "format.signature": "",
    "format.headers": "",
    "format.numbered": "false",
    "log.showSignature": "false",
    "commit.gpgSign": "false",
    "tag.gpgSign": "false",
    "gc.auto": "0",
    "am.threeWay": "false",
    "am.keepcr": "true",
    "init.defaultBranch": "main",
    "advice.detachedHead": "false",
    "user.name": COMMITTER_NAME,
    "user.email": COMMITTER_EMAIL,
}


HOOKS_ENV = "FORK_REBASE_GIT_HOOKS"

# Highest-precedence attributes of every tool-owned repository ($GIT_DIR/info/attributes): they
# override every attribute a tree's own .gitattributes could set, so an in-tree file cannot turn a
# file binary for diff/format-patch, pick a textconv or diff driver, a clean/smudge filter, an
# eol conversion or a merge driver (merge=union would hide conflicts). Then the tool's own file.
NEUTRAL_ATTRIBUTES = (
    "* !text !eol !crlf !filter !ident !diff !merge !whitespace !conflict-marker-size "
    "!working-tree-encoding !export-ignore !export-subst !delta !encoding\n"
)


def pin_attributes(git_dir: Path) -> None:
    """Write ``info/attributes`` of the repository at ``git_dir`` (idempotent, never via a link)."""
    from tools.rebase.git.safefs import write_file

    text = NEUTRAL_ATTRIBUTES + _ATTRIBUTES.read_text()
    path = Path(git_dir) / "info" / "attributes"
    try:
        if not path.is_symlink() and path.read_text() == text:
            return
    except (OSError, UnicodeDecodeError):
        pass
    write_file(Path(git_dir), path, text)


def _pinned_args():
    args = []
    for key, value in _PINNED_CONFIG.items():
        if key == "core.hooksPath" and os.environ.get(HOOKS_ENV):
            value = os.environ[HOOKS_ENV]
        args += ["-c", f"{key}={value}"]
    return args


def _discovery_env(cwd) -> dict:
    """Where ``cwd`` holds a ``.git``, git must use it or fail, never walk up to a repository
    above (the checkout's own, when a work repo lost its ``.git`` contents)."""
    try:
        if (Path(cwd) / ".git").exists() or str(cwd).endswith(".git"):  # a work tree or a bare cache repo
            return {"GIT_CEILING_DIRECTORIES": str(Path(cwd).resolve().parent)}
    except OSError:
        pass
    return {}


def hermetic_env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        LC_ALL="C",
        LANG="C",
        TZ="UTC",
        GIT_COMMITTER_NAME=COMMITTER_NAME,
        GIT_COMMITTER_EMAIL=COMMITTER_EMAIL,
        GIT_TERMINAL_PROMPT="0",
        GIT_EDITOR="true",
    )
    if extra:
        env.update(extra)
    return env


# Commands that could run a repository's own textconv or external diff program (its config and
# attributes name them; `report --repo` reads a repository the tool did not make).
_DIFFING = ("diff", "log", "show", "range-diff", "format-patch")


def _command(args) -> list:
    args = [str(a) for a in args]
    if args and args[0] in _DIFFING:
        args[1:1] = ["--no-textconv", "--no-ext-diff"]
    return ["git", *_pinned_args(), *args]


def _textconv_off(args, cwd) -> dict:
    """The config, as environment, that turns off every textconv the repository at ``cwd`` names
    for a ``range-diff``: it runs its own ``git log -p``, which takes no ``--no-textconv`` from it,
    so each ``diff.<driver>.textconv`` is pinned to ``cat`` (the file's bytes as they are)."""
    if not args or str(args[0]) != "range-diff":
        return {}
    proc = subprocess.run(["git", *_pinned_args(), "config", "-z", "--name-only", "--get-regexp",
                           r"^diff\..+\.textconv$"], cwd=str(cwd), env=hermetic_env(_discovery_env(cwd)),
                          capture_output=True)
    keys = [k for k in proc.stdout.decode("utf-8", "replace").split("\0") if k]
    env = {"GIT_CONFIG_COUNT": str(len(keys))}
    for i, key in enumerate(keys):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, "cat"
    return env if keys else {}


def git(*args, cwd, check=True, env=None, input=None, binary=False):
    """Run ``git args`` in ``cwd``; return stdout (str, or bytes when ``binary``)."""
    cmd = _command(args)
    proc = subprocess.run(
        cmd,
        cwd=str(cwd),
        env=hermetic_env({**_discovery_env(cwd), **_textconv_off(args, cwd), **(env or {})}),
        input=input.encode() if isinstance(input, str) else input,
        capture_output=True,
    )
    if check and proc.returncode != 0:
        raise GitFailed(args, proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout if binary else proc.stdout.decode("utf-8", "replace")


def git_proc(*args, cwd, env=None, input=None):
    """Run git and return the CompletedProcess without raising (stdout/stderr as text)."""
    cmd = _command(args)
    return subprocess.run(
        cmd, cwd=str(cwd), env=hermetic_env({**_discovery_env(cwd), **_textconv_off(args, cwd), **(env or {})}),
        input=input,
        capture_output=True, text=True
    )


class GitFailed(RebaseError):
    def __init__(self, args, code, stdout, stderr):
        self.code = code
        self.stdout = stdout.decode("utf-8", "replace") if isinstance(stdout, bytes) else stdout
        self.stderr = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else stderr
        super().__init__(
            f"git {' '.join(str(a) for a in args)} failed ({code}):\n{self.stderr.strip()}"
        )


def cat_objects(repo, specs: list) -> dict:
    """``{spec: (object id, type, bytes) or None}`` for many objects (``rev``, ``rev:path``,
    ``ref^{commit}``) in one ``git cat-file --batch`` call; None when git cannot find one."""
    if not specs:
        return {}
    if any("\n" in s for s in specs):
        raise RebaseError(f"object names must be one line: {[s for s in specs if chr(10) in s][0]!r}")
    raw = git("cat-file", "--batch", cwd=repo, input="".join(f"{s}\n" for s in specs), binary=True)
    out, pos = {}, 0
    for spec in specs:
        end = raw.index(b"\n", pos)
        header = raw[pos:end].decode("utf-8", "replace")
        pos = end + 1
        if header.endswith((" missing", " ambiguous")):
            out[spec] = None
            continue
        oid, kind, size = header.rsplit(" ", 2)
        out[spec] = (oid, kind, raw[pos:pos + int(size)])
        pos += int(size) + 1
    return out


def is_full_id(text: str) -> bool:
    """A full lowercase 40-hex object id (what git writes in HEAD and loose refs)."""
    return len(text) == 40 and all(c in "0123456789abcdef" for c in text)


SHORT_ID_HINT = ("; an abbreviated commit id is resolved only from objects at hand (--mirror PATH, a local "
                 "repository, or a commit fetched before): give the full 40-hex id")


def is_short_id(text: str) -> bool:
    """7 to 39 lowercase hex digits: what ``git log --oneline`` and people abbreviate ids to."""
    return 7 <= len(text) < 40 and all(c in "0123456789abcdef" for c in text)


def expand_short_id(repos, ref: str):
    """The one full commit id the abbreviation ``ref`` names in the first of ``repos`` (folders,
    bare or not; missing ones skipped) that knows it; None when ``ref`` is no abbreviation or
    none does (unknown, or ambiguous there)."""
    if not is_short_id(ref):
        return None
    for repo in repos:
        if not Path(repo).is_dir():
            continue
        full = rev_parse(repo, ref)
        if full and full.startswith(ref):
            return full
    return None


def _head_from_files(repo):
    """``(symbolic ref or "", commit id)`` when ``.git/HEAD`` holds a detached id or names a
    branch whose loose ref file holds one (loose refs win over packed ones in git too); else None."""
    gitdir = Path(repo) / ".git"
    try:
        text = (gitdir / "HEAD").read_text().strip()
        if is_full_id(text):
            return "", text
        if not text.startswith("ref: refs/heads/") or ".." in text or "\\" in text:
            return None
        ref = text[5:]
        value = (gitdir / ref).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return (ref, value) if is_full_id(value) else None


def head_commit(repo):
    """HEAD's commit id (None when HEAD names no commit), read from the files without a git
    process when they hold it plainly (commands check HEAD several times; a git process costs
    ~5 ms)."""
    found = _head_from_files(repo)
    return found[1] if found else rev_parse(repo, "HEAD")


def read_head(repo) -> tuple:
    """``(symbolic ref or "" when detached, commit id)`` of HEAD, as ``git symbolic-ref -q HEAD``
    and ``git rev-parse HEAD`` give them (from the files when they hold them plainly)."""
    found = _head_from_files(repo)
    if found:
        return found
    return (git_proc("symbolic-ref", "-q", "HEAD", cwd=repo).stdout.strip(),
            git("rev-parse", "HEAD", cwd=repo).strip())


def rev_parse(repo, rev):
    proc = git_proc("rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", cwd=repo)
    return proc.stdout.strip() if proc.returncode == 0 else None


def is_clean(repo) -> bool:
    return git("status", "--porcelain", "--untracked-files=all", cwd=repo).strip() == ""


def init_borrowing(repo: Path, lender: Path, *init_args) -> bool:
    """``git init`` ``repo`` reading ``lender``'s objects in place (git alternates): nothing is
    copied and nothing ``repo`` writes reaches ``lender``. False (a plain repo) when ``lender`` has
    no object store."""
    git("init", "-q", *init_args, cwd=repo)
    pin_attributes(repo / ".git")
    objects = lender / ".git" / "objects"
    if not objects.is_dir():
        return False
    write_file(repo, repo / ".git" / "objects" / "info" / "alternates", f"{objects.resolve()}\n")
    return True
