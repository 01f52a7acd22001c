"""What the last apply/export produced, so re-running with nothing changed is a fast no-op, and
so ``export`` can tell hand edits of ``patches/`` from its own output."""

import hashlib
import json
import os

from tools.rebase.errors import RebaseError
from tools.rebase.git.safefs import read_nofollow, write_file

_KEYS = {"digest": str, "base": str, "tip": str, "pin": str, "version": str}


def read_state(layout, tolerate_corrupt: bool = False) -> dict:
    """The recorded state, ``{}`` when there is none. A corrupt file is an error (it guards
    unexported work), unless ``tolerate_corrupt`` (``apply --force`` rebuilds it anyway)."""
    path = layout.state_file
    try:
        data = json.loads(read_nofollow(path))
    except FileNotFoundError:
        return {}
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        problem = f"not JSON ({exc})"
    else:
        problem = _problem(data)
        if not problem:
            return data
    if tolerate_corrupt:
        return {}
    raise RebaseError(f"{path} is corrupt: {problem}. It guards unexported work in {layout.work}; "
                      f"export or save that work, then `python -m tools.rebase apply --force` rebuilds it")


def _problem(data) -> str:
    if not isinstance(data, dict):
        return "not a JSON object"
    for key, kind in _KEYS.items():
        if key in data and not isinstance(data[key], kind):
            return f"{key!r} is not a {kind.__name__}"
    files = data.get("patch_files", {})
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return "'patch_files' is not a map of file names to digests"
    return ""


def write_state(layout, **values) -> None:
    values.setdefault("patch_files", patch_files(layout))
    write_file(layout.root, layout.state_file, json.dumps(values, indent=2, sort_keys=True) + "\n")


def _series_entries(path) -> bytes:
    """The series' entry list: export keeps its comments, so only the entries count as an edit."""
    from tools.rebase.stack.series import read_series

    try:
        return "\n".join(read_series(path).names).encode()
    except (RebaseError, OSError, UnicodeDecodeError):
        return b"unreadable:" + read_nofollow(path)


def patch_files(layout) -> dict:
    """sha256 of what ``export`` writes or deletes: the entries of ``patches/series`` and every
    ``patches/*.patch`` (a link is hashed by its target's name, never followed)."""
    out = {}
    if layout.patches.is_dir():
        for path in sorted(layout.patches.iterdir()):
            if path.name != "series" and not path.name.endswith(".patch"):
                continue
            if path.is_symlink():
                data = b"symlink:" + os.readlink(path).encode()
            elif path.name == "series" and path.is_file():
                data = _series_entries(path)
            elif path.is_file():
                data = read_nofollow(path)
            else:
                data = b"not a file"
            out[path.name] = hashlib.sha256(data).hexdigest()
    return out


def changed_patch_files(layout, state: dict) -> list:
    """Files of ``patches/`` added, edited or removed since the last apply/export recorded them."""
    if "patch_files" not in state:
        return []
    recorded, now = state["patch_files"], patch_files(layout)
    return sorted(n for n in set(recorded) | set(now) if recorded.get(n) != now.get(n))


def current_digest(layout, patches) -> str:
    """Digest of what apply builds from: the pin, the series and every patch file, in order."""
    from tools.rebase.stack.stack import stack_digest

    return stack_digest(
        read_nofollow(layout.pin),
        read_nofollow(layout.series),
        [read_nofollow(p.path) for p in patches],
    )
