"""Where things live in a checkout of the fork, found from any directory inside it."""

import os
from dataclasses import dataclass
from pathlib import Path

from tools.rebase.errors import RebaseError

PIN_FILE = "upstream.toml"
STATE_DIR = ".rebase"
# Entries of .rebase/ the tool creates; each must be a real file or folder.
STATE_ENTRIES = ("lock", "state.json", "work", "work/.git", "cache", "bump", "last-bump")


def find_root(start=None) -> Path:
    """Walk up from ``start`` (default: cwd) to the checkout root holding the pin file."""
    if start is not None and not Path(start).is_dir():
        raise RebaseError(f"-C {start}: no such directory")
    here = Path(start or os.getcwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / PIN_FILE).is_file() and (candidate / "patches").is_dir():
            return candidate
    # Fall back to the checkout this tool was loaded from (e.g. `python -m` from elsewhere), but
    # never when a directory was named: that would act on another checkout than the one asked for.
    tool_root = Path(__file__).resolve().parents[3]
    if start is None and (tool_root / PIN_FILE).is_file():
        return tool_root
    raise RebaseError(f"no {PIN_FILE} and patches/ found in {here} or any parent directory")


@dataclass(frozen=True)
class Layout:
    """All paths the tool reads or writes, relative to one checkout root."""

    root: Path

    @property
    def pin(self) -> Path:
        return self.root / PIN_FILE

    @property
    def patches(self) -> Path:
        return self.root / "patches"

    @property
    def series(self) -> Path:
        return self.patches / "series"

    @property
    def resolutions(self) -> Path:
        return self.root / "patches" / "resolutions"

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

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
        return Path(os.environ.get("FORK_REBASE_CACHE", self.state_dir / "cache"))

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
        return self.root / "REBASE_REPORT.md"

    @property
    def report_json(self) -> Path:
        return self.root / "REBASE_REPORT.json"

    def refuse_links(self) -> None:
        """A pull request can commit any of the tool's own paths as a symlink (``.gitignore`` does not
        stop a committed file): writing through one would land outside the checkout, reading through
        one would pull an outside file in. Refuse before anything is read or written."""
        owned = (self.pin, self.patches, self.state_dir, self.package, self.report_md, self.report_json)
        linked = [p.name for p in owned if p.is_symlink()]
        linked += [f"{STATE_DIR}/{name}" for name in STATE_ENTRIES if (self.state_dir / name).is_symlink()]
        if linked:
            raise RebaseError(f"{self.root}: {', '.join(linked)} must not be symlinks (the tool reads "
                              f"and writes them in place); replace them with real files or folders")
        self.refuse_tracked()

    def refuse_tracked(self) -> None:
        """``.rebase/`` is the tool's private state and ``megatron/`` its output: neither is ever
        committed. A tracked file there came from a commit (a pull request), so the tool would take
        it as its own lock, work repo, cache or journal: an error naming it, read from the
        checkout's own index (hermetic git, nothing of the checkout's config runs)."""
        if not (self.root / ".git").exists():
            return  # not a git checkout (an unpacked archive): the writes refuse links themselves
        from tools.rebase.git.gitcmd import git_proc

        env = {"GIT_DIR": str(self.root / ".git"), "GIT_WORK_TREE": str(self.root)}
        proc = git_proc("ls-files", "-z", "--", STATE_DIR, "megatron", cwd=self.root, env=env)
        tracked = [p for p in proc.stdout.split("\0") if p] if proc.returncode == 0 else []
        if tracked:
            shown = ", ".join(tracked[:5]) + (f" and {len(tracked) - 5} more" if len(tracked) > 5 else "")
            raise RebaseError(
                f"{self.root}: {shown} {'is' if len(tracked) == 1 else 'are'} tracked by git, but "
                f"{STATE_DIR}/ (the tool's state) and megatron/ (generated) are never committed: the "
                f"tool would take a committed file there as its own. Remove it from the commit "
                f"(git rm -r --cached -- {STATE_DIR} megatron); nothing was read or written")


def layout(start=None) -> Layout:
    found = Layout(find_root(start))
    found.refuse_links()
    return found
