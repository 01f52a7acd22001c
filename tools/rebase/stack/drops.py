"""A line's recorded drops: ``lines/NAME/patches/dropped``, the release line's patches that this
line leaves out on purpose (upstream ``dev`` absorbed them, say), one ``Patch-Name: reason`` a line.

Why a file: a line is refreshed by ``seed --line NAME`` (which copies the release line's series)
and a bump. Without a record, every refresh brought the dropped patches back and the bump stopped
on them again. ``bump --continue --drop`` on a line writes the entry; the line's bump drops every
listed patch when the replay reaches it, conflict or not (``bump/replay.py``; ``seed`` still copies
them, since on the old base later patches may need their context); ``check`` lints the file.
The release line has no such file:
a patch it drops is gone from its own series.
"""

from tools.rebase.errors import RebaseError
from tools.rebase.git import names
from tools.rebase.git.safefs import read_nofollow, write_file
from tools.rebase.stack.series import _refuse_link

FILE_NAME = "dropped"
HEADER = (
    "# Patches of the release line that this line drops on purpose: `Patch-Name: reason`.\n"
    "# Written by `bump --line NAME --continue --drop`; the line's next bump drops them again.\n"
)


def drops_path(layout):
    return layout.patches / FILE_NAME


def parse_drops(text: str, where: str) -> dict:
    """``{Patch-Name: reason}`` of a drops file's text; a malformed line is an error naming it."""
    drops = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, reason = line.partition(":")
        name, reason = name.strip(), reason.strip()
        here = f"{where}:{number}"
        if not sep or not reason:
            raise RebaseError(f"{here}: expected `Patch-Name: reason`, got {raw!r}")
        names.patch_name(name, here, field="dropped Patch-Name")
        if name in drops:
            raise RebaseError(f"{here}: {name!r} is listed twice")
        drops[name] = reason
    return drops


def read_drops(layout) -> dict:
    """The line's recorded drops (empty without the file; only a line's bump writes one, but a
    dry run reads it in its scratch copy, which is laid out like the release line)."""
    path = drops_path(layout)
    _refuse_link(path)
    if not path.exists():
        return {}
    return parse_drops(read_nofollow(path).decode("utf-8"), layout.rel(path))


def record_drop(layout, name: str, reason: str) -> bool:
    """Add (or keep) ``name`` in the line's drops; False on the release line (nothing recorded)."""
    if layout.line is None:
        return False
    reason = " ".join(reason.split())
    if not reason:
        raise RebaseError(f"recording the drop of {name!r}: the reason is empty")
    drops = read_drops(layout)
    if drops.get(name) == reason:
        return True
    drops.setdefault(name, reason)
    body = "".join(f"{n}: {r}\n" for n, r in drops.items())
    write_file(layout.root, drops_path(layout), HEADER + body)
    return True


def lint_drops(layout, series_names) -> list:
    """Problems of the drops file: unreadable or malformed, or a dropped patch still in the series."""
    try:
        drops = read_drops(layout)
    except RebaseError as exc:
        return [str(exc)]
    shown = layout.rel(drops_path(layout))
    return [f"{shown}: {name!r} is recorded as dropped but is in the line's series"
            for name in drops if name in series_names]
