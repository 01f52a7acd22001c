"""The bump journal: what a bump has done so far, on disk, so it survives being killed.

``begin`` first copies everything a bump may change (pin, ``patches/``, the report, the tool's
state, the last-bump record, the work repo's refs, HEAD and config) into ``.rebase/bump/backup``
and only then writes ``journal.json``; every later step rewrites the journal atomically. While the
journal exists a bump is in progress: ``--continue`` picks it up from the journal and the work
repo, ``--abort`` puts the saved copies back. The journal is deleted last, so an interrupted
abort or finish can simply be run again.
"""

import json
import os
import shutil
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.gitcmd import git, git_proc

JOURNAL_VERSION = 1


def bump_dir(layout) -> Path:
    return layout.state_dir / "bump"


def journal_path(layout) -> Path:
    return bump_dir(layout) / "journal.json"


def backup_dir(layout) -> Path:
    return bump_dir(layout) / "backup"


def last_bump_dir(layout) -> Path:
    return layout.state_dir / "last-bump"


def _saved_paths(layout):
    """(name in backup, live path) of everything a bump may change outside the work repo."""
    return [
        ("upstream.toml", layout.pin),
        ("patches", layout.patches),
        ("REBASE_REPORT.md", layout.report_md),
        ("REBASE_REPORT.json", layout.report_json),
        ("README.md", layout.root / "README.md"),
        ("state.json", layout.state_file),
        ("last-bump", last_bump_dir(layout)),
    ]


def load(layout):
    path = journal_path(layout)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise RebaseError(f"{path}: the bump journal is corrupt ({exc}); run bump --abort") from None
    if data.get("version") != JOURNAL_VERSION:
        raise RebaseError(f"{path}: journal version {data.get('version')!r} is not {JOURNAL_VERSION}")
    return data


def save(layout, data: dict) -> None:
    path = journal_path(layout)
    tmp = path.with_name("journal.json.tmp")
    # Written whole, then renamed: a kill leaves either the old or the new journal, never a mix.
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _copy(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=True)
    else:
        shutil.copy2(src, dst)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def work_refs(work: Path) -> dict:
    out = git("for-each-ref", "--format=%(refname) %(objectname)", cwd=work)
    return dict(line.split(" ", 1) for line in out.splitlines() if line)


def begin(layout, data: dict) -> dict:
    """Back up everything, then write the journal; return it."""
    root = bump_dir(layout)
    backup = backup_dir(layout)
    if backup.exists():  # left by a bump killed before its journal existed: nothing had changed
        shutil.rmtree(backup)
    backup.mkdir(parents=True)
    present = []
    for name, live in _saved_paths(layout):
        if live.exists():
            _copy(live, backup / name)
            present.append(name)
    work = layout.work
    shutil.copy2(work / ".git" / "config", backup / "work-config")
    head_ref = git_proc("symbolic-ref", "-q", "HEAD", cwd=work).stdout.strip()
    data = dict(data)
    data.update(
        version=JOURNAL_VERSION,
        backup_present=present,
        work_refs=work_refs(work),
        work_head_ref=head_ref,
        work_head=git("rev-parse", "HEAD", cwd=work).strip(),
    )
    root.mkdir(parents=True, exist_ok=True)
    save(layout, data)
    return data


def restore(layout, data: dict) -> None:
    """Put back the pin, patches/, report, state and the work repo exactly as before the bump."""
    work = layout.work
    backup = backup_dir(layout)
    if (work / ".git").exists():
        for args in (("rebase", "--quit"), ("cherry-pick", "--quit"), ("merge", "--quit"), ("am", "--quit"),
                     ("rerere", "clear"), ("reset", "-q", "--hard")):
            git_proc(*args, cwd=work)
        before = data["work_refs"]
        now = work_refs(work)
        for ref in sorted(set(now) - set(before)):
            git("update-ref", "-d", ref, cwd=work)
        for ref, sha in sorted(before.items()):
            if now.get(ref) != sha:
                git("update-ref", ref, sha, cwd=work)
        if data["work_head_ref"]:
            git("symbolic-ref", "HEAD", data["work_head_ref"], cwd=work)
            git("reset", "-q", "--hard", data["work_head"], cwd=work)
        else:
            git("checkout", "-q", "-f", "--detach", data["work_head"], cwd=work)
        git("clean", "-q", "-fd", cwd=work)
        if (backup / "work-config").is_file():
            shutil.copy2(backup / "work-config", work / ".git" / "config")
    present = set(data["backup_present"])
    for name, live in _saved_paths(layout):
        staging = live.with_name(live.name + ".bump-restore")
        _remove(staging)
        if name in present:
            _copy(backup / name, staging)
            _remove(live)
            os.replace(staging, live)
        else:
            _remove(live)


def finish(layout) -> None:
    """Forget the journal (last), then the backup."""
    journal_path(layout).unlink(missing_ok=True)
    shutil.rmtree(backup_dir(layout), ignore_errors=True)
