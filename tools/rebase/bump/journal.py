"""The bump journal: what a bump has done so far, on disk, so it survives being killed.

``begin`` first copies everything a bump may change (pin, ``patches/``, the report, README.md, the
tool's state, the last-bump record, the work repo's refs, HEAD, config and rerere cache) into
``.rebase/bump/backup``, writes the backup's own manifest (``backup.json``: what to put back), and
only then writes ``journal.json``; every later step rewrites the journal atomically. While the
journal exists a bump is in progress: ``--continue`` picks it up from the journal and the work
repo, ``--abort`` puts the saved copies back using only the backup, so it works even when the
journal itself is damaged. The journal is deleted last, so an interrupted abort or finish can
simply be run again.

The journal is a typed record (``Journal``): loading validates every field, and a damaged file is
an error that names the field, never read as "no bump".
"""

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

from tools.rebase.git.gitcmd import git, git_proc, read_head
from tools.rebase.git.owned import BACKUP_MARKER, BACKUP_PURPOSE, mark

from tools.rebase.bump.journal_records import Backup, CorruptJournal, Journal, _build
from tools.rebase.git.safefs import copy_entry, exchange, read_nofollow, write_file


def bump_dir(layout) -> Path:
    return layout.bump_dir


def journal_path(layout) -> Path:
    return layout.bump_journal


def backup_dir(layout) -> Path:
    return bump_dir(layout) / "backup"


def last_bump_dir(layout) -> Path:
    return layout.state_dir / "last-bump"


# ---------------------------------------------------------------- files

def _saved_paths(layout):
    """(name in backup, live path) of everything a bump may change outside the work repo's refs."""
    return [
        ("upstream.toml", layout.pin),
        ("patches", layout.patches),
        ("REBASE_REPORT.md", layout.report_md),
        ("REBASE_REPORT.json", layout.report_json),
        ("README.md", layout.readme),
        ("state.json", layout.state_file),
        ("last-bump", last_bump_dir(layout)),
        ("rr-cache", layout.work / ".git" / "rr-cache"),
    ]


def _write_atomic(path: Path, text: str) -> None:
    # Written whole, then renamed: a kill leaves either the old or the new file, never a mix.
    from tools.rebase.git.safefs import write_file

    write_file(path.parent, path, text)  # exclusive random temporary, never through a link


def load(layout) -> Journal | None:
    """The bump in progress, None when there is none; a damaged journal is a ``CorruptJournal``."""
    path = journal_path(layout)
    if not path.is_file():
        return None
    try:
        return Journal.from_json(path.read_text())
    except (ValueError, TypeError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise CorruptJournal(f"{path}: the bump journal is corrupt ({exc}); `python -m tools.rebase bump "
                             f"--abort` restores everything from the backup in {backup_dir(layout)}") from None


def in_progress(layout) -> bool:
    return journal_path(layout).is_file()


def save(layout, journal: Journal) -> None:
    journal.validate()
    _write_atomic(journal_path(layout), journal.to_json())


def _copy(src: Path, dst: Path) -> None:
    copy_entry(dst.parent, src, dst)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def work_refs(work: Path) -> dict:
    out = git("for-each-ref", "--format=%(refname) %(objectname)", cwd=work)
    return dict(line.split(" ", 1) for line in out.splitlines() if line)


def begin(layout, journal: Journal) -> Journal:
    """Back up everything (manifest last), then write the journal; return it."""
    backup = backup_dir(layout)
    if backup.exists():  # left by a bump killed before its journal existed: nothing had changed
        shutil.rmtree(backup)
    backup.mkdir(parents=True)
    mark(backup, BACKUP_MARKER, BACKUP_PURPOSE)
    present = []
    for name, live in _saved_paths(layout):
        if live.exists() or live.is_symlink():
            _copy(live, backup / name)
            present.append(name)
    work = layout.work
    copy_entry(backup, work / ".git" / "config", backup / "work-config")
    head_ref, head = read_head(work)
    saved = Backup(present=present, work_refs=work_refs(work), work_head_ref=head_ref, work_head=head)
    saved.validate()
    _write_atomic(backup / "backup.json", json.dumps(asdict(saved), indent=2, sort_keys=True) + "\n")
    save(layout, journal)
    return journal


def load_backup(layout) -> Backup:
    path = backup_dir(layout) / "backup.json"
    try:
        return _build(Backup, json.loads(path.read_text()), "backup")
    except FileNotFoundError:
        raise CorruptJournal(f"{path} is missing: the bump's backup is incomplete, so nothing can be "
                             f"restored from it; restore upstream.toml, patches/ and the report with git "
                             f"and run `python -m tools.rebase apply --force`") from None
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        raise CorruptJournal(f"{path}: the bump's backup manifest is corrupt ({exc}); restore "
                             f"upstream.toml, patches/ and the report with git and run "
                             f"`python -m tools.rebase apply --force`") from None


# What a bump writes in the checkout only once it is finishing (before, at a stop, it writes
# recorded resolutions under patches/resolutions/ and its own state only).
_WRITTEN_WHEN_FINISHING = ("upstream.toml", "patches", "REBASE_REPORT.md", "REBASE_REPORT.json", "README.md")


def _tree_bytes(path: Path) -> dict:
    """``{relative name: bytes or link target}`` of a file, link or folder ("" for the path itself)."""
    if path.is_symlink():
        return {"": "link:" + os.readlink(path)}
    if path.is_file():
        return {"": path.read_bytes()}
    if not path.is_dir():
        return {}
    return {p.relative_to(path).as_posix(): ("link:" + os.readlink(p)) if p.is_symlink() else p.read_bytes()
            for p in sorted(path.rglob("*")) if p.is_symlink() or p.is_file()}


def edited_during_bump(layout, journal) -> list:
    """Checkout paths that differ from the backup although the bump, in its journal's phase, has not
    written them yet: edits made by hand while it was stopped, which a restore would lose. None
    can be told apart once it is finishing (or when the journal is unreadable)."""
    if journal is None or journal.phase == "finishing":
        return []
    backup, present, edited = backup_dir(layout), set(load_backup(layout).present), []
    for name, live in _saved_paths(layout):
        if name not in _WRITTEN_WHEN_FINISHING:
            continue
        before = _tree_bytes(backup / name) if name in present else {}
        now = _tree_bytes(live)
        if name == "patches":  # recorded resolutions and drops are the bump's own while it is stopped
            before, now = ({k: v for k, v in d.items() if not k.startswith("resolutions/") and k != "dropped"}
                           for d in (before, now))
        for rel in sorted(set(before) | set(now)):
            if before.get(rel) != now.get(rel):
                edited.append(layout.rel(live / rel) if rel else layout.rel(live))
    return edited


def restore(layout) -> None:
    """Put back the pin, patches/, report, state and the work repo exactly as before the bump
    (from the backup alone: the journal may be the thing that is damaged)."""
    from tools.rebase.git.gitlocks import clear_stale_locks

    saved = load_backup(layout)
    work = layout.work
    backup = backup_dir(layout)
    if (work / ".git").exists():
        clear_stale_locks(work)
        for args in (("rebase", "--quit"), ("cherry-pick", "--quit"), ("merge", "--quit"), ("am", "--quit"),
                     ("reset", "-q", "--hard")):
            git_proc(*args, cwd=work)
        before = saved.work_refs
        now = work_refs(work)
        for ref in sorted(set(now) - set(before)):
            git("update-ref", "-d", ref, cwd=work)
        for ref, sha in sorted(before.items()):
            if now.get(ref) != sha:
                git("update-ref", ref, sha, cwd=work)
        if saved.work_head_ref:
            git("symbolic-ref", "HEAD", saved.work_head_ref, cwd=work)
            git("reset", "-q", "--hard", saved.work_head, cwd=work)
        else:
            git("checkout", "-q", "-f", "--detach", saved.work_head, cwd=work)
        git("clean", "-q", "-fd", cwd=work)
        (work / ".git" / "MERGE_RR").unlink(missing_ok=True)
        if (backup / "work-config").is_file():
            write_file(work, work / ".git" / "config", read_nofollow(backup / "work-config"))
    present = set(saved.present)
    for name, live in _saved_paths(layout):
        staging = live.with_name(live.name + ".bump-restore")
        _remove(staging)
        if name in present:
            _copy(backup / name, staging)
            _swap_in(staging, live)
        else:
            _remove(live)


def _swap_in(staging: Path, live: Path) -> None:
    """Put ``staging`` at ``live`` so that a kill leaves one of the two whole at ``live``: files
    and links by one rename, folders by one atomic exchange (the old one is removed after); where
    the file system cannot exchange, the old folder is renamed aside first (``find_root`` still
    finds the checkout by its backup, and the next ``bump --abort`` finishes)."""
    aside = live.with_name(live.name + ".bump-old")
    if live.is_dir() and not live.is_symlink() and staging.is_dir() and exchange(staging, live):
        _remove(staging)  # now the old folder
    elif live.is_dir() and not live.is_symlink():
        _remove(aside)
        os.rename(live, aside)
        os.replace(staging, live)
    else:
        if staging.is_dir() and os.path.lexists(live):
            _remove(live)  # a file or link where the folder goes
        os.replace(staging, live)  # a file or a link (replaced itself, never followed), or nothing there
    _remove(aside)  # this run's, or one a killed run left


def finish(layout) -> None:
    """Forget the journal (last), then the backup."""
    journal_path(layout).unlink(missing_ok=True)
    shutil.rmtree(backup_dir(layout), ignore_errors=True)
