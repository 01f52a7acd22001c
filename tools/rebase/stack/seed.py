"""``seed --line NAME``: make a line's series, patch files and pin the release line's, the first
step of refreshing the line (then ``bump --line NAME --onto ...``, which replays them onto the
line's base with its recorded resolutions).

Why a command: copying the files by hand dropped what only the line's patches said. A line adds
``Tests:`` ids for code that exists on its base alone (upstream main's mHC layer, say), and the
refresh from the release line lost them. Kept: the line's ``resolutions/``, proof record, report
and every ``Tests:`` id its version of a patch names that the release line's does not; where the
line's ``Upstream-Status:`` differs from the release line's (the line reduced the patch on its base),
the line's whole message. Refused: a
line holding patches the release line lacks (they would be lost), a bump in progress on the line,
unexported work in its work repo, and patch files edited since its last apply or export. The
patches the line records as dropped (``patches/dropped``) are copied too: they may carry context
later patches need on the old base; the refresh's bump drops them again (``bump/replay.py``). The
files it replaces are saved under the line's state directory first; a failure while writing puts
them back, and a kill while writing leaves that backup marked in progress: the next ``seed`` takes
the line's own files from it and finishes (the half-seeded files are no hand edits).
"""

import dataclasses
import shutil
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.git.lock import locked
from tools.rebase.git.owned import STAMP_SUFFIX, is_marked, mark
from tools.rebase.git.safefs import create_new, makedirs, read_nofollow, write_file
from tools.rebase.stack.pin import load_pin
from tools.rebase.stack.series import _patch_break, _refuse_link, parse_patch, read_series
from tools.rebase.stack.state import changed_patch_files, read_state
from tools.rebase.stack.workrepo import guard_work_repo, refuse_during_bump


@dataclasses.dataclass
class Seeded:
    patches: int
    kept_tests: dict  # Patch-Name -> the line-only Tests: ids carried over
    backup: Path


def add_test_ids(text: str, ids: list, where: str) -> str:
    """``text`` of a format-patch file with ``ids`` appended, one per folded line, to the last
    ``Tests:`` trailer of its message (which ends where ``git am`` starts reading the patch)."""
    lines = text.split("\n")
    end = next((i for i, line in enumerate(lines) if _patch_break(line)), None)
    starts = [i for i, line in enumerate(lines[:end]) if line.startswith("Tests:")]
    if end is None or not starts:
        raise RebaseError(f"{where}: no 'Tests:' trailer in its message to add the line's ids to")
    i = starts[-1] + 1
    while i < end and lines[i][:1] in (" ", "\t") and lines[i].strip():
        i += 1
    return "\n".join(lines[:i] + [f" {t}" for t in ids] + lines[i:])


def _message_end(lines: list) -> int:
    """Index of the line where ``git am`` stops reading a format-patch file's message."""
    return next((i for i, line in enumerate(lines) if _patch_break(line)), len(lines))


def with_message_of(text: str, donor: str) -> str:
    """``text`` (a format-patch file) with the header and message of ``donor`` (another version
    of the same patch): the line's own decision about a patch survives a refresh."""
    lines, donor_lines = text.split("\n"), donor.split("\n")
    return "\n".join(donor_lines[:_message_end(donor_lines)] + lines[_message_end(lines):])


def _stack_of(layout):
    """``[(file name, PatchFile)]`` of a line's series (every listed file parsed, links refused)."""
    if not layout.series.is_file():
        return []
    return [(name, parse_patch(layout.patches / name)) for name in read_series(layout.series).names]


def _refuse_links(release, line) -> None:
    """Nothing is read through, or written through, a link a pull request committed."""
    for path in (release.pin, release.series, line.pin, line.series, line.patches):
        _refuse_link(path)
    if line.patches.is_dir():
        for path in line.patches.glob("*.patch"):
            _refuse_link(path)


def _refuse_losing_work(line, resumed=None) -> None:
    """Refuse hand edits of the line's patch files; ``resumed`` (the killed seed's backup and what
    this seed writes): a file as that seed left it (the line's own, saved, or the release line's)
    is no edit."""
    refuse_during_bump(line, "seed")
    state = read_state(line)
    guard_work_repo(line, state)
    changed = changed_patch_files(line, state)
    if resumed is not None:
        changed = [name for name in changed if not _left_by_the_killed_seed(line, *resumed, name)]
    if changed:
        raise RebaseError(
            f"{line.patches} changed since the line's last apply or export: {', '.join(changed)}; "
            f"seed would replace them. Export or restore them first. Nothing was written."
        )


def seeded_files(release, line, own=None) -> tuple:
    """What the line's patches/ gets: ``{file name: text}`` (series included) and the kept ids.
    ``own``: where the line's own series and patch files are (a killed seed's backup), if not in
    its patches/."""
    line_patches = {p.name: p for _, p in _stack_of(own or line)}
    release_stack = _stack_of(release)
    release_names = {p.name for _, p in release_stack}
    only_line = sorted(n for n in line_patches if n not in release_names)
    if only_line:
        raise RebaseError(
            f"line {line.line!r} has patches the release line lacks: {', '.join(only_line)}; seed would "
            f"lose them: add them to the release line first (or drop them from the line). Nothing was written."
        )
    files, kept = {}, {}
    for file_name, patch in release_stack:
        text = read_nofollow(release.patches / file_name).decode("utf-8")
        mine = line_patches.get(patch.name)
        if mine and mine.upstream_status != patch.upstream_status:
            # The line decided about this patch on its base (reduced, say): its message, with its
            # Upstream-Status and Tests:, goes with the release line's change.
            text = with_message_of(text, read_nofollow(mine.path).decode("utf-8"))
            kept[patch.name] = [t for t in mine.tests if t not in patch.tests]
            files[file_name] = text
            continue
        extra = [t for t in (mine.tests if mine else []) if t not in patch.tests]
        if extra:
            text = add_test_ids(text, extra, f"{release.rel(release.patches / file_name)}")
            kept[patch.name] = extra
        files[file_name] = text
    files["series"] = read_nofollow(release.series).decode("utf-8")
    return files, kept


def _check_written(root: Path, staging: Path, files: dict, kept: dict) -> None:
    """Every seeded patch file parses, and names the ids it was meant to keep."""
    for name, text in files.items():
        if name == "series":
            continue
        write_file(root, staging / name, text)
        patch = parse_patch(staging / name)
        missing = [t for t in kept.get(patch.name, []) if t not in patch.tests]
        if missing:
            raise RebaseError(f"seed: {name} lost the line's Tests: ids {missing} (a tool bug); nothing was written")


def seed_line(line, log=print) -> Seeded:
    """Seed ``line`` (a named line's Layout) from the release line of the same checkout."""
    if line.line is None:
        raise RebaseError("seed copies the release line into a line: pass --line NAME")
    release = dataclasses.replace(line, line=None)
    with locked(line, "seed"):
        _refuse_links(release, line)
        backup = seed_backup(line)
        resumed = _killed_seed(backup)
        if not resumed:
            _refuse_losing_work(line)
        files, kept = seeded_files(release, line, own=_SavedStack(backup) if resumed else None)
        if resumed:
            _refuse_losing_work(line, (backup, files))
        staging = line.state_dir / "seed-staging"
        for path in (staging,) + (() if resumed else (backup,)):  # left by an earlier seed (never followed if a link)
            if path.is_symlink() or path.is_file():
                path.unlink()
            elif path.is_dir():
                shutil.rmtree(path)
        makedirs(line.root, staging)
        _check_written(line.root, staging, files, kept)
        if resumed:
            log(f"seed: finishing the seed of line {line.line!r} that was stopped midway (its backup "
                f"{line.rel(backup)} holds the line's own files)")
        else:
            _save_line(line, backup)
            create_new(backup, backup / IN_PROGRESS, b"")  # from here a kill leaves a seed the next one finishes
        old = sorted(line.patches.glob("*.patch")) if line.patches.is_dir() else []
        try:
            for path in old:
                if path.name not in files:
                    path.unlink()
            for name, text in files.items():
                write_file(line.root, line.patches / name, text)
            write_file(line.root, line.pin, read_nofollow(release.pin))
        except BaseException:
            _restore(line, backup, files)
            (backup / IN_PROGRESS).unlink()
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        (backup / IN_PROGRESS).unlink()
    count = len(files) - 1
    log(f"seeded line {line.line!r} from the release line: {count} patches and the pin; kept its "
        f"resolutions/, proof record and report"
        + ("; kept its own Tests: ids: " + ", ".join(f"{n} ({len(ids)})" for n, ids in kept.items()) if kept else "")
        + f"; the replaced files are in {line.rel(backup)}. Next: python -m tools.rebase bump"
        f"{line.line_flag} --onto {_onto_spec(backup / line.pin.name)}")
    return Seeded(count, kept, backup)


SEED_MARKER, SEED_PURPOSE = "megatron-rebase-seed", "a seed's backup"
IN_PROGRESS = "SEEDING"  # in the backup while a seed writes the line's files


class _SavedStack:
    """A killed seed's backup read as the line's own stack (``series`` and patch files)."""

    def __init__(self, folder: Path):
        self.patches, self.series = folder, folder / "series"


def _killed_seed(backup: Path) -> bool:
    """Whether a seed was killed while writing the line's files: its backup (one this tool made
    here, ``git/owned.py``) still says it is in progress."""
    return (backup.is_dir() and not backup.is_symlink() and is_marked(backup, SEED_MARKER, SEED_PURPOSE)
            and (backup / IN_PROGRESS).is_file())


def _left_by_the_killed_seed(line, backup: Path, files: dict, name: str) -> bool:
    """Whether the line's patch file ``name`` is as a killed seed left it: its own (saved in the
    backup), the release line's it was writing, or removed by it."""
    path = line.patches / name
    if not path.is_file() or path.is_symlink():
        return not path.is_symlink()
    now = read_nofollow(path)
    saved = backup / name
    return (name in files and now == files[name].encode()) or (
        saved.is_file() and not saved.is_symlink() and now == read_nofollow(saved))


def _save_line(line, backup: Path) -> None:
    """Copy the line's series, patch files and pin into a new backup the tool marks as its own."""
    makedirs(line.root, backup)
    mark(backup, SEED_MARKER, SEED_PURPOSE)
    old = sorted(line.patches.glob("*.patch")) if line.patches.is_dir() else []
    for path in old + [line.series, line.pin]:
        if path.is_file():
            write_file(line.root, backup / path.name, read_nofollow(path))


def seed_backup(layout) -> Path:
    """Where ``seed`` saves the files it replaces."""
    return layout.state_dir / "seed-backup"


def seeded_away_files(layout, patch_name: str) -> set:
    """The files the line's own version of ``patch_name`` changed before ``seed`` replaced it with
    the release line's (from the seed's backup, which only ``seed --line`` writes, and the dry run
    copies into its scratch checkout); empty for a checkout never seeded."""
    return files_of_patch(seed_backup(layout), patch_name)


def files_of_patch(folder: Path, patch_name: str) -> set:
    """The files the patch file named ``patch_name`` in ``folder`` (a ``patches/`` or a seed's
    backup) changes; empty when there is none (links and unreadable files are skipped)."""
    if folder.is_symlink() or not folder.is_dir():
        return set()
    for path in sorted(folder.glob("*.patch")):
        if path.is_symlink() or not path.is_file():
            continue
        try:
            patch = parse_patch(path)
        except RebaseError:
            continue
        if patch.name == patch_name:
            return set(patch.files)
    return set()


def _onto_spec(saved_pin: Path) -> str:
    """The ``--onto`` spec of the line's base before the seed (from its saved pin)."""
    try:
        pin = load_pin(saved_pin)
    except (OSError, RebaseError):
        return "<the line's base>"
    return f"pypi:{pin.package}=={pin.version}" if pin.kind == "pypi" else f"git:{pin.url}@{pin.commit}"


def _restore(line, backup: Path, files: dict) -> None:
    """Put the saved series, patch files and pin back after a failed write."""
    for name in files:
        if name != "series" and not (backup / name).exists():
            (line.patches / name).unlink(missing_ok=True)
    for saved in backup.iterdir():
        if saved.name in (IN_PROGRESS, SEED_MARKER, SEED_MARKER + STAMP_SUFFIX):
            continue
        target = line.pin if saved.name == line.pin.name else line.patches / saved.name
        write_file(line.root, target, read_nofollow(saved))
