"""Copy the patched package out of the work repo as top-level ``megatron/`` and stamp its version.

The copy is guarded by a manifest of file hashes: if someone edited the materialized tree by hand,
re-materializing refuses instead of silently discarding the edits (edits belong in the work repo).
"""

import ast
import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.git.safefs import copy_entry, read_nofollow, write_file

PACKAGE_DIR = "megatron"
MANIFEST = ".fork-manifest.json"
VERSION_FILE = Path("core") / "package_info.py"
STAMP_MARK = "# --- stamped by tools.rebase when the fork was materialized ---"
# The public version upstream's package_info.py may spell: three integers and PEP 440's canonical
# pre-, post- and dev-release segments. Anything else (a quote, a space, a "+") is refused, so the
# stamp's quoting is fixed and nothing a patch writes can change what setup.py reads as the version.
PUBLIC_VERSION = re.compile(r"^[0-9]+(?:\.[0-9]+)*(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?$")
PRE_RELEASE = re.compile(r"^(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?$")
# What the stamp's version may hold: the public version and a local label of letters, digits, dots.
STAMPED_VERSION = re.compile(PUBLIC_VERSION.pattern[:-1] + r"\+[a-z0-9]+(?:\.[a-z0-9]+)*$")


def upstream_version(package_info: Path) -> str:
    """Read MAJOR/MINOR/PATCH/PRE_RELEASE literals from upstream's package_info.py."""
    values = {}
    try:
        tree = ast.parse(read_nofollow(package_info).decode("utf-8"))  # a link in a hostile upstream is refused
    except SyntaxError as exc:
        raise RebaseError(f"{package_info}: does not parse ({exc.msg}, line {exc.lineno})") from None
    except UnicodeDecodeError as exc:
        raise RebaseError(f"{package_info}: not UTF-8 ({exc})") from None
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in ("MAJOR", "MINOR", "PATCH", "PRE_RELEASE"):
                try:  # never run: the file comes from the archive and the patches
                    values[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    raise RebaseError(f"{package_info}: {target.id} is not a literal (line {node.lineno}); "
                                      f"the version is read without running the file") from None
    missing = [name for name in ("MAJOR", "MINOR", "PATCH") if name not in values]
    if missing:
        raise RebaseError(f"{package_info}: cannot find {', '.join(missing)} to compute the version")
    for name in ("MAJOR", "MINOR", "PATCH"):
        if type(values[name]) is not int or values[name] < 0:
            raise RebaseError(f"{package_info}: {name} = {values[name]!r} is not a non-negative integer; "
                              f"the version is not stamped")
    pre = values.get("PRE_RELEASE", "")
    if not isinstance(pre, str) or not PRE_RELEASE.match(pre):
        raise RebaseError(f"{package_info}: PRE_RELEASE = {pre!r} is not a PEP 440 pre-, post- or dev-release "
                          f"segment (such as 'rc0', '.post1', '.dev2' or ''); the version is not stamped")
    return f"{values['MAJOR']}.{values['MINOR']}.{values['PATCH']}{pre}"


def fork_version(base_version: str, patch_count: int, stack_digest: str, line: str | None = None) -> str:
    """PEP 440: ``<upstream version>+rl.<patches>.<digest>``, e.g. ``0.19.0+rl.5.3f2a9c1d``; a line
    other than the release line is named in it: ``0.19.0+rl.dev.40.3f2a9c1d`` for ``upstream-dev``."""
    if not PUBLIC_VERSION.match(base_version):
        raise RebaseError(f"upstream version {base_version!r} is not a PEP 440 public version; not stamped")
    label = "" if line is None else line_label(line) + "."
    return f"{base_version}+rl.{label}{patch_count}.{stack_digest[:8]}"


def line_label(line: str) -> str:
    """A line's name as a PEP 440 local-label part: ``upstream-dev`` -> ``dev``, ``x_y-z`` -> ``x.y.z``."""
    name = line.removeprefix("upstream-")
    return re.sub(r"[^a-z0-9]+", ".", name.lower()).strip(".") or "line"


def stamp_line(version: str) -> str:
    """The stamp's one line, always in single quotes; the version is checked to hold no quote."""
    if not STAMPED_VERSION.match(version):
        raise RebaseError(f"fork version {version!r} is not a PEP 440 version with a local label; not stamped")
    return f"__version__ = '{version}'"


def _hash_tree(root: Path) -> dict:
    """``{relative path: sha256}``; a symlink (never followed) is recorded by its target.

    Skipped: ``__pycache__`` folders, compiled files and the manifest itself. Plain ``os.scandir``
    and string paths: every bump and apply hashes the whole package (~600 files) this way."""
    out = {}

    def walk(folder: str, prefix: str) -> None:
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:  # unreadable: its files count as missing (os.walk skipped it the same way)
            return
        for entry in entries:
            name = entry.name
            is_dir = entry.is_dir()  # follows a link, as os.walk sorts entries
            if is_dir and name == "__pycache__":
                continue
            if is_dir and not entry.is_symlink():
                walk(entry.path, f"{prefix}{name}/")
                continue
            if name == MANIFEST or name.endswith((".pyc", ".so")):
                continue
            if entry.is_symlink():
                out[prefix + name] = f"symlink -> {os.readlink(entry.path)}"
            else:
                out[prefix + name] = _file_digest(entry.path)

    walk(str(root), "")
    return out


def _file_digest(path: str) -> str:
    """sha256 of a regular file, streamed; a FIFO or device (an unpacked archive can carry one in
    ``megatron/``) is recorded as such, never opened for a read that would block or never end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return "not a regular file"
        h = hashlib.sha256()
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
        return h.hexdigest()


def refuse_symlinks(tree: Path) -> None:
    """Megatron ships no symlinks; one in the patched tree would copy an outside file (or loop)
    into the package, so it is an error naming the link."""
    if tree.is_symlink():
        raise RebaseError(f"{tree}: is a symlink (to {os.readlink(tree)!r}); nothing was materialized")
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in sorted(dirnames + filenames):
            full = Path(dirpath) / name
            if full.is_symlink():
                raise RebaseError(
                    f"{full}: is a symlink (to {os.readlink(full)!r}); the package must not contain "
                    f"symlinks (a patch or the upstream base added it); nothing was materialized"
                )


def local_edits(target: Path) -> list:
    """Files in ``target`` that differ from what the tool last wrote there."""
    manifest_path = target / MANIFEST
    if not target.exists():
        return []
    if not manifest_path.is_file():
        return ["(no manifest: this megatron/ was not written by tools.rebase)"]
    try:
        recorded = json.loads(read_nofollow(manifest_path))  # regular, bounded, never through a link
    except (RebaseError, json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        return [f"(the manifest {MANIFEST} is corrupt: {exc}; cannot tell which files were edited)"]
    if not isinstance(recorded, dict):
        return [f"(the manifest {MANIFEST} is corrupt: not a JSON object)"]
    current = _hash_tree(target)
    changed = [p for p in sorted(set(recorded) | set(current)) if recorded.get(p) != current.get(p)]
    return changed


def materialize(work_tree: Path, target: Path, version: str, force: bool = False) -> bool:
    """Replace ``target`` with ``work_tree/megatron`` stamped with ``version``; False if unchanged."""
    source = work_tree / PACKAGE_DIR
    if not source.is_dir():
        raise RebaseError(f"{work_tree}: the upstream tree has no {PACKAGE_DIR}/ package")
    edits = local_edits(target)
    if edits and not force:
        shown = "\n  ".join(edits[:10]) + ("\n  ..." if len(edits) > 10 else "")
        raise RebaseError(
            f"{target} has local edits that would be overwritten:\n  {shown}\n"
            f"Edit the work repo (.rebase/work) and export instead, or pass --force to discard them."
        )
    refuse_symlinks(source)
    for stale in target.parent.glob(target.name + ".tmp-*"):  # left by a killed run (callers hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    staging = target.with_name(f"{target.name}.tmp-materialize-{os.getpid()}")
    copy_entry(target.parent, source, staging, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    info = staging / VERSION_FILE
    write_file(staging, info, info.read_text().rstrip("\n") + f"\n\n{STAMP_MARK}\n{stamp_line(version)}\n")
    manifest = _hash_tree(staging)
    if target.exists() and (target / MANIFEST).is_file() and _hash_tree(target) == manifest:
        shutil.rmtree(staging)
        return False
    write_file(staging, staging / MANIFEST, json.dumps(manifest, indent=0, sort_keys=True))
    swap_in(staging, target)
    return True


def swap_in(staging: Path, target: Path) -> None:
    """Replace the folder ``target`` with the finished ``staging`` next to it: two renames, so a
    kill leaves the old tree, the new one, or both (the ``.tmp-*`` leftovers the next run clears)."""
    if target.exists():
        old = target.with_name(f"{target.name}.tmp-old-{os.getpid()}")
        os.replace(target, old)
        os.replace(staging, target)
        shutil.rmtree(old)
    else:
        os.replace(staging, target)


@contextlib.contextmanager
def commit_tree_copy(work: Path, commit: str, scratch_parent: Path):
    """A temporary folder holding ``commit``'s ``megatron/`` as git would check it out, made with
    a private index, so the work repo's checkout and branch stay where they are."""
    from tools.rebase.git.gitcmd import git

    scratch_parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"tree-{os.getpid()}-", dir=scratch_parent))
    try:
        env = {"GIT_INDEX_FILE": str(tmp / "index")}
        git("read-tree", f"{commit}:{PACKAGE_DIR}", cwd=work, env=env)
        git("checkout-index", "-a", f"--prefix={tmp / 'tree' / PACKAGE_DIR}/", cwd=work, env=env)
        yield tmp / "tree"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
