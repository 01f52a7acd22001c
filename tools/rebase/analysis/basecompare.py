"""Compare the old and the new base: is the move a downgrade, and what changed in the package.

Moving onto an older or lower-versioned base is legal (e.g. from an sdist onto the git commit that
comes closest to it) but must never happen unnoticed. The headline "files changed" counts only the
package directory, split into added / modified / deleted: tests, docs and CI files of a git
checkout are not shipped by the sdist and would drown the number.
"""

import ast

from tools.rebase.git.gitcmd import git, git_proc

PACKAGE_DIR = "megatron/"
VERSION_FILE = "megatron/core/package_info.py"


def _version_of(text) -> str:
    """The version in a ``package_info.py`` text ("" when it cannot be read)."""
    if text is None:
        return ""
    values = {}
    try:
        for node in ast.parse(text).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if node.targets[0].id in ("MAJOR", "MINOR", "PATCH", "PRE_RELEASE"):
                    values[node.targets[0].id] = ast.literal_eval(node.value)
    except (SyntaxError, ValueError):
        return ""
    if not all(k in values for k in ("MAJOR", "MINOR", "PATCH")):
        return ""
    return f"{values['MAJOR']}.{values['MINOR']}.{values['PATCH']}{values.get('PRE_RELEASE') or ''}"


def base_version(repo, commit: str) -> str:
    """The version in the base's ``package_info.py`` ("" when it cannot be read)."""
    from tools.rebase.analysis.lint import read_blobs

    spec = f"{commit}:{VERSION_FILE}"
    return _version_of(read_blobs(repo, [spec])[spec])


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


def base_specs(old_base: str, new_base: str) -> list:
    """What ``downgrade_warnings`` reads: both bases' version file and commit object."""
    return [f"{old_base}:{VERSION_FILE}", f"{new_base}:{VERSION_FILE}", old_base, new_base]


def downgrade_warnings(repo, old_base: str, new_base: str, old_pin=None, new_pin=None, objects=None) -> list:
    """Why the move from ``old_base`` to ``new_base`` looks like going backwards (empty if not).
    ``objects``: ``read_blobs`` of ``base_specs`` when the caller has read them already."""
    from tools.rebase.analysis.lint import read_blobs

    out = []
    specs = base_specs(old_base, new_base)
    # One cat-file call: the version files, and the commit objects for their committer times.
    blobs = objects if objects is not None and all(s in objects for s in specs) else read_blobs(repo, specs)
    old_v, new_v = _version_of(blobs[specs[0]]), _version_of(blobs[specs[1]])
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
    else:
        import time

        old_t, new_t = committer_time(blobs[old_base]), committer_time(blobs[new_base])
        if old_t is None or new_t is None:  # not commits: let git say what is wrong
            old_t, new_t = (int(x) for x in git("show", "-s", "--format=%ct", old_base, new_base, cwd=repo).split())
        if new_t < old_t:
            day = lambda t: time.strftime("%Y-%m-%d", time.gmtime(t))  # noqa: E731
            out.append(f"older base: the new base dates from {day(new_t)}, the old one from {day(old_t)}")
    return out


def committer_time(obj):
    """The committer timestamp (``%ct``) of a raw commit object's text, or None."""
    if obj is None:
        return None
    for line in obj.split("\n"):
        if not line:
            break  # end of the header
        if line.startswith("committer "):
            try:
                return int(line.rsplit(" ", 2)[1])
            except (IndexError, ValueError):
                return None
    return None


def package_changes(repo, old_base: str, new_base: str, package: str = PACKAGE_DIR) -> dict:
    """``{"added", "modified", "deleted"}`` file counts under ``package`` between the bases."""
    out = git("diff", "--name-status", "--no-renames", old_base, new_base, "--", package, cwd=repo)
    counts = {"added": 0, "modified": 0, "deleted": 0}
    for line in out.splitlines():
        status = line[:1]
        key = {"A": "added", "D": "deleted"}.get(status, "modified")
        counts[key] += 1
    return counts
