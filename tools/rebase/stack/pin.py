"""The upstream pin (``upstream.toml``): which base the series applies to, and how to verify it."""

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tools.rebase.git import names
from tools.rebase.git.safefs import read_nofollow
from tools.rebase.errors import RebaseError

PACKAGE = "megatron-core"
# Set by a maintainer (never read from the checkout): other package names a pin may name.
ALLOW_PACKAGE_ENV = "FORK_REBASE_ALLOW_PACKAGE"
# The upstream repository a committed git pin may name; ``FORK_REBASE_ALLOW_GIT_URL=URL[,URL]`` in
# the environment (never the checkout) lets a maintainer add others (an entry ending in "/" allows
# every URL or path below it).
UPSTREAM_GIT_URLS = ("https://github.com/NVIDIA/Megatron-LM.git", "https://github.com/NVIDIA/Megatron-LM")
ALLOW_GIT_URL_ENV = "FORK_REBASE_ALLOW_GIT_URL"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_PYPI_SPEC = re.compile(r"^pypi:(?P<package>[A-Za-z0-9._-]+)==(?P<version>[A-Za-z0-9.+!_-]+)$")


@dataclass(frozen=True)
class Pin:
    kind: str  # "pypi" or "git"
    package: str = ""
    version: str = ""
    sha256: str = ""
    url: str = ""
    commit: str = ""
    ref: str = ""
    # A git pin's tree digest (stack/archive.py): lets a build without a mirror take upstream's
    # archive of the commit instead of its history, checked against this.
    tree_sha256: str = ""

    @property
    def label(self) -> str:
        """Stable name for tags and reports, unique per content."""
        if self.kind == "pypi":
            return f"pypi/{self.package}-{self.version}-{self.sha256[:12]}"
        return f"git/{self.commit}"

    @property
    def display(self) -> str:
        if self.kind == "pypi":
            return f"{self.package}=={self.version} (sdist sha256 {self.sha256})"
        ref = f" ({self.ref})" if self.ref else ""
        return f"{self.url}@{self.commit}{ref}"

    def to_toml(self) -> str:
        lines = [
            "# The upstream base the patch series applies to.",
            '# kind = "pypi": a source distribution, verified by sha256 before anything is applied.',
            '# kind = "git":  a repository (URL or local path) and a full 40-hex commit id.',
            "[upstream]",
            f'kind = "{self.kind}"',
        ]
        if self.kind == "pypi":
            lines += [
                f'package = "{self.package}"',
                f'version = "{self.version}"',
                f'sha256 = "{self.sha256}"',
            ]
        else:
            lines += [f'url = "{_escape(self.url)}"', f'commit = "{self.commit}"']
            if self.ref:
                lines.append(f'ref = "{_escape(self.ref)}"')
            if self.tree_sha256:
                lines.append(f'tree_sha256 = "{self.tree_sha256}"')
        return "\n".join(lines) + "\n"


# A git pin's tree digest is a check value of its commit (the same commit always has the same one, and
# an archive that does not match is refused): it changes nothing apply builds, so the stack digest
# (proof records, the version label) is taken without its line.
_TREE_DIGEST_LINE = re.compile(rb'^tree_sha256 = "[0-9a-f]{64}"\r?\n?', re.M)


def digested_pin_bytes(pin_bytes: bytes) -> bytes:
    """The pin file's bytes as the stack digest reads them: without the ``tree_sha256`` line."""
    return _TREE_DIGEST_LINE.sub(b"", pin_bytes)


def allowed_package(name: str, where: str) -> str:
    """The pin names ``megatron-core``: a pull request that points it at another project (with
    that project's own hash) must not make CI fetch it. ``FORK_REBASE_ALLOW_PACKAGE=NAME[,NAME]``
    in the environment lets a maintainer name another."""
    extra = [n.strip() for n in os.environ.get(ALLOW_PACKAGE_ENV, "").split(",") if n.strip()]
    if _canonical(name) not in {_canonical(n) for n in [PACKAGE, *extra]}:
        raise RebaseError(f"{where}: package {name!r} is not {PACKAGE!r}; the fork is built on "
                          f"{PACKAGE} only (a maintainer may allow another name with "
                          f"{ALLOW_PACKAGE_ENV}={name} in the environment)")
    return name


def allowed_git_url(url: str, where: str) -> str:
    """A committed git pin names the upstream repository: a pull request that points it at another
    repository (with that repository's own commit id) must not make CI fetch and build from it."""
    extra = [u.strip() for u in os.environ.get(ALLOW_GIT_URL_ENV, "").split(",") if u.strip()]
    if url in UPSTREAM_GIT_URLS or url in extra or any(e.endswith("/") and url.startswith(e) for e in extra):
        return url
    raise RebaseError(f"{where}: url {url!r} is not the upstream repository ({UPSTREAM_GIT_URLS[0]}); a git pin "
                      f"names that one only (a maintainer may allow another with {ALLOW_GIT_URL_ENV}={url} "
                      f"in the environment, or keep the upstream URL in the pin and pass --mirror PATH)")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def load_pin(path: Path) -> Pin:
    try:
        data = tomllib.loads(read_nofollow(path).decode("utf-8"))  # a regular file, bounded, no link
    except FileNotFoundError:
        raise RebaseError(f"{path}: upstream pin file is missing") from None
    except UnicodeDecodeError as exc:
        raise RebaseError(f"{path}: not UTF-8 ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise RebaseError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise RebaseError(f"{path}: not valid TOML: nested too deeply") from None
    table = data.get("upstream")
    if not isinstance(table, dict):
        raise RebaseError(f"{path}: needs an [upstream] table")
    return pin_from_table(table, where=str(path))


def pin_from_table(table: dict, where: str) -> Pin:
    """Validate every field: they reach file names, tags and git/pip command lines."""
    kind = table.get("kind")
    if kind == "pypi":
        missing = [k for k in ("package", "version", "sha256") if not table.get(k)]
        if missing:
            raise RebaseError(f"{where}: pypi pin lacks {', '.join(missing)}")
        sha256 = table["sha256"]
        if not isinstance(sha256, str) or not _SHA256.match(sha256):
            raise RebaseError(f"{where}: sha256 must be a string of 64 lowercase hex digits, got {sha256!r}")
        package, version = names.package_name(table["package"], where), names.version(table["version"], where)
        return Pin("pypi", package=allowed_package(package, where), version=version, sha256=sha256)
    if kind == "git":
        missing = [k for k in ("url", "commit") if not table.get(k)]
        if missing:
            raise RebaseError(f"{where}: git pin lacks {', '.join(missing)}")
        commit = table["commit"]
        if not isinstance(commit, str) or not _COMMIT.match(commit):
            raise RebaseError(
                f"{where}: commit must be a full 40-hex commit id, got {commit!r}"
            )
        ref = table.get("ref", "")
        ref = names.git_ref(ref, where) if ref != "" else ""  # every field is checked before the URL is judged
        tree_sha256 = table.get("tree_sha256", "")
        if tree_sha256 != "" and (not isinstance(tree_sha256, str) or not _SHA256.match(tree_sha256)):
            raise RebaseError(f"{where}: tree_sha256 must be a string of 64 lowercase hex digits, got {tree_sha256!r}")
        url = allowed_git_url(names.pinned_git_url(table["url"], where), where)
        return Pin("git", url=url, commit=commit, ref=ref, tree_sha256=tree_sha256)
    raise RebaseError(f"{where}: kind must be \"pypi\" or \"git\", got {kind!r}")


def parse_spec(spec: str):
    """Parse a ``--onto`` spec: ``pypi:NAME==VERSION`` or ``git:URL-or-path@ref``.

    Returns ``("pypi", package, version)`` or ``("git", url, ref)``; checksums and commit ids are
    resolved later, when the source is fetched.
    """
    where = f"--onto {spec!r}"
    m = _PYPI_SPEC.match(spec)
    if m:
        package = allowed_package(names.package_name(m["package"], where), where)
        return ("pypi", package, names.version(m["version"], where))
    if spec.startswith("git:"):
        body = spec[len("git:"):]
        url, sep, ref = body.rpartition("@")
        if not sep or not url or not ref:
            raise RebaseError(f"bad spec {spec!r}: expected git:URL-or-path@ref")
        url = names.git_url(url, where)
        if names.is_local_path(url):  # typed on the command line: relative to where it was typed
            url = str(Path(url).expanduser().resolve())
        return ("git", url, names.git_ref(ref, where))
    raise RebaseError(f"bad spec {spec!r}: expected pypi:NAME==VERSION or git:URL-or-path@ref")
