"""Where things live in a checkout of the fork, found from any directory inside it."""

import os
from dataclasses import dataclass
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.git import names
from tools.rebase.git.checkout_bytes import refuse_converted_inputs

PIN_FILE = "upstream.toml"
STATE_DIR = ".rebase"
# Entries of .rebase/ (and of a line's .rebase/lines/<name>/) the tool creates; each must be a real
# file or folder.
STATE_ENTRIES = ("lock", "state.json", "work", "work/.git", "cache", "bump", "last-bump")
LINES_DIR = "lines"
# What git says (its messages are pinned to the C locale) when it finds no repository it will read
# at a checkout's .git: a gitfile whose target is absent (a worktree or submodule copied into a
# container) or a stub, and a repository owned by another user (CI containers), which a git that
# checks ownership even for an explicit GIT_DIR refuses. Either leaves the checkout like a tarball.
NO_REPOSITORY_ANSWERS = ("not a git repository", "detected dubious ownership")


# Where export renames patches/ aside on a file system without an atomic exchange (stack/stack.py).
EXPORT_ASIDE = ".{name}-export-old"


def _mid_restore(candidate: Path) -> bool:
    """A checkout whose ``patches/`` a killed ``bump --abort`` was putting back (without an atomic
    exchange): its backup still holds the folder, so the next ``bump --abort`` can finish."""
    return (candidate / STATE_DIR / "bump" / "backup" / "patches").is_dir()


def find_root(start=None) -> Path:
    """Walk up from ``start`` (default: cwd) to the checkout root holding the pin file."""
    if start is not None and not Path(start).is_dir():
        raise RebaseError(f"-C {start}: no such directory")
    here = Path(start or os.getcwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / PIN_FILE).is_file() and ((candidate / "patches").is_dir() or _mid_restore(candidate)
                                                  or (candidate / EXPORT_ASIDE.format(name="patches")).is_dir()):
            return candidate
    # Fall back to the checkout this tool was loaded from (e.g. `python -m` from elsewhere), but
    # never when a directory was named: that would act on another checkout than the one asked for.
    tool_root = Path(__file__).resolve().parents[3]
    if start is None and (tool_root / PIN_FILE).is_file():
        return tool_root
    raise RebaseError(f"no {PIN_FILE} and patches/ found in {here} or any parent directory")


# Build output of setuptools and build, at the checkout's top: never committed (``refuse_tracked``).
BUILD_OUTPUT = ("build", "dist", ":(glob)*.egg-info/**")


@dataclass(frozen=True)
class Layout:
    """All paths the tool reads or writes, relative to one checkout root, for one line of the stack.

    ``line`` None is the release line at the top level; a named line keeps its pin, patches and
    report in ``lines/<name>/`` and its work repo, state and bump journal in ``.rebase/lines/<name>/``,
    so the two never share mutable state. The download cache, the lock and ``megatron/`` (the one
    package the tests import: it holds the line applied last) stay the checkout's."""

    root: Path
    line: str | None = None

    @property
    def home(self) -> Path:
        """Where the line's committed files live: the checkout root, or ``lines/<name>/``."""
        return self.root if self.line is None else self.root / LINES_DIR / self.line

    def rel(self, path: Path) -> str:
        """``path`` as messages name it: relative to the checkout root."""
        return path.relative_to(self.root).as_posix()

    @property
    def line_flag(self) -> str:
        """What a suggested command needs to act on this line again (nothing for the release line)."""
        return "" if self.line is None else f" --line {self.line}"

    @property
    def pin(self) -> Path:
        return self.home / PIN_FILE

    @property
    def patches(self) -> Path:
        return self.home / "patches"

    @property
    def series(self) -> Path:
        return self.patches / "series"

    @property
    def resolutions(self) -> Path:
        return self.patches / "resolutions"

    @property
    def state_dir(self) -> Path:
        top = self.root / STATE_DIR
        return top if self.line is None else top / LINES_DIR / self.line

    @property
    def lock_file(self) -> Path:
        """One lock for every line: they share ``megatron/`` and the cache."""
        return self.root / STATE_DIR / "lock"

    @property
    def bump_dir(self) -> Path:
        """A bump's journal and backup (``bump/journal.py``)."""
        return self.state_dir / "bump"

    @property
    def bump_journal(self) -> Path:
        """Present exactly while a bump is in progress; the stack layer refuses to apply over it."""
        return self.bump_dir / "journal.json"

    @property
    def cache(self) -> Path:
        return Path(os.environ.get("FORK_REBASE_CACHE", self.root / ".rebase" / "cache"))

    @property
    def work(self) -> Path:
        return self.state_dir / "work"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def package(self) -> Path:
        return self.root / "megatron"

    @property
    def report_md(self) -> Path:
        return self.home / "REBASE_REPORT.md"

    @property
    def report_json(self) -> Path:
        return self.home / "REBASE_REPORT.json"

    @property
    def readme(self) -> Path:
        """The README whose patch table follows this line (a line's own is optional)."""
        return self.home / "README.md"

    def for_line(self, line: str | None) -> "Layout":
        """The same checkout's layout of another line (validated like ``--line``)."""
        found = Layout(self.root, None if line is None else names.line_name(line, "--line"))
        found.refuse_links()
        return found

    def refuse_links(self) -> None:
        """A pull request can commit any of the tool's own paths as a symlink (``.gitignore`` does not
        stop a committed file): writing through one would land outside the checkout, reading through
        one would pull an outside file in. Refuse before anything is read or written."""
        self._recover_interrupted_export()
        owned = (self.pin, self.patches, self.state_dir, self.package, self.report_md, self.report_json)
        if self.line is not None:
            self._refuse_line_escape()
            owned = (self.root / LINES_DIR, self.home, self.root / STATE_DIR, self.state_dir.parent) + owned
        linked = [self.rel(p) if self.line else p.name for p in owned if p.is_symlink()]
        state_dirs = (self.root / STATE_DIR,) + ((self.state_dir,) if self.line is not None else ())
        linked += [self.rel(d / name) for d in state_dirs for name in STATE_ENTRIES if (d / name).is_symlink()]
        if linked:
            raise RebaseError(f"{self.root}: {', '.join(linked)} must not be symlinks (the tool reads "
                              f"and writes them in place); replace them with real files or folders")
        self.refuse_tracked()
        refuse_converted_inputs(self.root)
        self.refuse_foreign_work_repo()

    def _recover_interrupted_export(self) -> None:
        """Without an atomic exchange, export renames patches/ aside and then the new folder in: a
        kill between leaves only the aside copy, which is put back (the old series, whole)."""
        aside = self.patches.with_name(EXPORT_ASIDE.format(name=self.patches.name))
        if not os.path.lexists(self.patches) and aside.is_dir() and not aside.is_symlink():
            os.rename(aside, self.patches)

    def refuse_foreign_work_repo(self) -> None:
        """The work repo must be one the tool created here (``git/owned.py``): one a checkout
        carried (a tarball of a pull request has no index to refuse it by) or left by something
        else could set ``core.worktree`` or ``include.path`` in its config, which git obeys."""
        from tools.rebase.git.owned import WORK_MARKER, WORK_PURPOSE, refuse_unmarked

        refuse_unmarked(self.work / ".git", WORK_MARKER, WORK_PURPOSE,
                        f"If it is yours and holds nothing unexported, remove {self.rel(self.work)} and run "
                        f"`python -m tools.rebase apply{self.line_flag}` to rebuild it.")

    def refuse_tracked(self) -> None:
        """``.rebase/`` is the tool's private state and ``megatron/`` its output: neither is ever
        committed. A tracked file there came from a commit (a pull request), so the tool would take
        it as its own lock, work repo, cache or journal: an error naming it, read from the
        checkout's own index (hermetic git, nothing of the checkout's config runs).

        Only where git finds no repository to read does the check pass over the checkout, as it does
        one with no ``.git`` (a tarball): git's answers in ``NO_REPOSITORY_ANSWERS``. Any other
        failure (a damaged index, say) is an error, since the files there cannot be vouched for."""
        if not (self.root / ".git").exists():
            return  # not a git checkout (an unpacked archive): the writes refuse links themselves
        from tools.rebase.git.gitcmd import git_proc

        env = {"GIT_DIR": str(self.root / ".git"), "GIT_WORK_TREE": str(self.root)}
        try:
            proc = git_proc("ls-files", "-z", "--", STATE_DIR, "megatron", *BUILD_OUTPUT, cwd=self.root, env=env)
        except OSError as exc:
            raise RebaseError(f"{self.root}: git could not be run to list the files tracked under "
                              f"{STATE_DIR}/ and megatron/ ({exc}); nothing was read or written") from None
        if proc.returncode != 0:
            if any(answer in proc.stderr for answer in NO_REPOSITORY_ANSWERS):
                return  # no index to read: as safe as an archive (the tool's own files carry markers)
            said = " ".join(proc.stderr.split())[:300] or "no message"
            raise RebaseError(
                f"{self.root}: git ls-files failed (exit {proc.returncode}: {said}), so the tool cannot "
                f"tell whether a commit put files under {STATE_DIR}/ or megatron/. Only a .git that is no "
                f"repository or one git refuses for its owner ({' / '.join(NO_REPOSITORY_ANSWERS)}) is "
                f"passed over like a tarball; repair the repository (a damaged index: remove .git/index "
                f"and run git reset) and rerun; nothing was read or written")
        tracked = [p for p in proc.stdout.split("\0") if p]
        built = [p for p in tracked if not p.startswith((f"{STATE_DIR}/", "megatron/"))]
        if built:
            shown = ", ".join(built[:5]) + (f" and {len(built) - 5} more" if len(built) > 5 else "")
            raise RebaseError(
                f"{self.root}: {shown} {'is' if len(built) == 1 else 'are'} tracked by git, but build/, "
                f"dist/ and *.egg-info/ are build output, never committed: a build could ship a committed "
                f"file from there (build/lib/sitecustomize.py would run at every interpreter start). Remove "
                f"it from the commit (git rm -r --cached -- build dist '*.egg-info'); nothing was read or written")
        if tracked:
            shown = ", ".join(tracked[:5]) + (f" and {len(tracked) - 5} more" if len(tracked) > 5 else "")
            raise RebaseError(
                f"{self.root}: {shown} {'is' if len(tracked) == 1 else 'are'} tracked by git, but "
                f"{STATE_DIR}/ (the tool's state) and megatron/ (generated) are never committed: the "
                f"tool would take a committed file there as its own. Remove it from the commit "
                f"(git rm -r --cached -- {STATE_DIR} megatron); nothing was read or written")

    def _refuse_line_escape(self) -> None:
        """``lines/<name>`` must be a real folder of this checkout: a committed link (or a link on
        the way to it) would make the tool read and write a stack outside it."""
        where = self.root / LINES_DIR / self.line
        if where.is_symlink() or (self.root / LINES_DIR).is_symlink():
            raise RebaseError(f"--line {self.line}: {self.rel(where)} must be a real folder, not a symlink")
        if not where.is_dir():
            raise RebaseError(f"--line {self.line}: no folder {self.rel(where)}/ in {self.root} "
                              f"(a line holds its own upstream.toml and patches/ there)")
        if where.resolve().parent != (self.root / LINES_DIR).resolve() or \
                not where.resolve().is_relative_to(self.root.resolve()):
            raise RebaseError(f"--line {self.line}: {self.rel(where)} resolves outside {self.root}")


def layout(start=None, line=None) -> Layout:
    """The checkout's layout for ``line`` (None: the release line at the top level)."""
    if line is not None:
        names.line_name(line, "--line")
    found = Layout(find_root(start), line)
    found.refuse_links()
    return found
