"""Compare the old and the new base: is the move a downgrade, and what changed in the package.

Moving onto an older or lower-versioned base is legal (e.g. from an sdist onto the git commit that
comes closest to it) but must never happen unnoticed. The headline "files changed" counts only the
package directory, split into added / modified / deleted: tests, docs and CI files of a git
checkout are not shipped by the sdist and would drown the number.
"""

import ast

from tools.rebase.gitcmd import git, git_proc

PACKAGE_DIR = "megatron/"
VERSION_FILE = "megatron/core/package_info.py"


def base_version(repo, commit: str) -> str:
    """The version in the base's ``package_info.py`` ("" when it cannot be read)."""
    proc = git_proc("show", f"{commit}:{VERSION_FILE}", cwd=repo)
    if proc.returncode != 0:
        return ""
    values = {}
    try:
        for node in ast.parse(proc.stdout).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if node.targets[0].id in ("MAJOR", "MINOR", "PATCH", "PRE_RELEASE"):
                    values[node.targets[0].id] = ast.literal_eval(node.value)
    except (SyntaxError, ValueError):
        return ""
    if not all(k in values for k in ("MAJOR", "MINOR", "PATCH")):
        return ""
    return f"{values['MAJOR']}.{values['MINOR']}.{values['PATCH']}{values.get('PRE_RELEASE') or ''}"


def _older(a: str, b: str):
    """True when version ``a`` < ``b``, None when they cannot be compared."""
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # packaging ships with pip; compare release numbers only
        try:
            return tuple(int(x) for x in a.split(".")[:3]) < tuple(int(x) for x in b.split(".")[:3])
        except ValueError:
            return None
    try:
        return Version(a) < Version(b)
    except InvalidVersion:
        return None


def _date(repo, commit: str) -> int:
    return int(git("show", "-s", "--format=%ct", commit, cwd=repo).strip())


def downgrade_warnings(repo, old_base: str, new_base: str, old_pin=None, new_pin=None) -> list:
    """Why the move from ``old_base`` to ``new_base`` looks like going backwards (empty if not)."""
    out = []
    old_v, new_v = base_version(repo, old_base), base_version(repo, new_base)
    if old_pin is not None and old_pin.kind == "pypi":
        old_v = old_pin.version
    if new_pin is not None and new_pin.kind == "pypi":
        new_v = new_pin.version
    if old_v and new_v and _older(new_v, old_v):
        out.append(f"downgrade: the new base is version {new_v}, lower than the old base's {old_v}")
    old_up = old_pin.commit if old_pin is not None and old_pin.kind == "git" else ""
    new_up = new_pin.commit if new_pin is not None and new_pin.kind == "git" else ""
    if old_up and new_up and old_up != new_up and git_proc(
            "merge-base", "--is-ancestor", new_up, old_up, cwd=repo).returncode == 0:
        out.append(f"downgrade: the new upstream commit {new_up[:12]} is an ancestor of the old one {old_up[:12]}")
    elif _date(repo, new_base) < _date(repo, old_base):
        import time

        day = lambda c: time.strftime("%Y-%m-%d", time.gmtime(_date(repo, c)))  # noqa: E731
        out.append(f"older base: the new base dates from {day(new_base)}, the old one from {day(old_base)}")
    return out


def package_changes(repo, old_base: str, new_base: str, package: str = PACKAGE_DIR) -> dict:
    """``{"added", "modified", "deleted"}`` file counts under ``package`` between the bases."""
    out = git("diff", "--name-status", "--no-renames", old_base, new_base, "--", package, cwd=repo)
    counts = {"added": 0, "modified": 0, "deleted": 0}
    for line in out.splitlines():
        status = line[:1]
        key = {"A": "added", "D": "deleted"}.get(status, "modified")
        counts[key] += 1
    return counts
