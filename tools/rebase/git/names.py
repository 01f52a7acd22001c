"""Checks for untrusted strings that become file names, paths or command-line arguments.

The pin, the patch files and ``--onto`` come from pull requests, so a value like ``../x`` (a path
outside the checkout) or ``--upload-pack=...`` (an option to git) must be refused before it reaches
the file system or a command line. Every check raises a RebaseError naming the field and where it
came from.
"""

import re

from tools.rebase.errors import RebaseError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# PEP 508 project name; PEP 440 version characters (epoch '!', local '+').
_PACKAGE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
# Branch and tag names and commit ids as git accepts them for a fetch, without refspec syntax.
_REF = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/-]*$")
# A remote-helper address (``ext::cmd``, ``fd::0``) runs or wires up arbitrary commands.
_HELPER = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::")
SLUG = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
RERERE_ID = re.compile(r"^[0-9a-f]{40}(?:\.[0-9]+)?$")


def _text(value, field: str, where: str) -> str:
    if not isinstance(value, str):
        raise RebaseError(f"{where}: {field} must be a string, got {type(value).__name__} {value!r}")
    if not value:
        raise RebaseError(f"{where}: {field} is empty")
    if _CONTROL.search(value):
        raise RebaseError(f"{where}: {field} {value!r} contains a control character")
    return value


def not_an_option(value, field: str, where: str) -> str:
    """A string that will be passed to git or pip: it must not start with '-'."""
    _text(value, field, where)
    if value.startswith("-"):
        raise RebaseError(f"{where}: {field} {value!r} starts with '-' and would be read as an option; "
                          f"refusing it")
    return value


def path_component(value, field: str, where: str, pattern=None) -> str:
    """A string used as one file or directory name: no separators, no '..', no leading '-'."""
    not_an_option(value, field, where)
    if "/" in value or "\\" in value or value == "." or ".." in value:
        raise RebaseError(f"{where}: {field} {value!r} must be a plain name (no '/', '\\' or '..')")
    if pattern is not None and not pattern.match(value):
        raise RebaseError(f"{where}: {field} {value!r} must match {pattern.pattern}")
    return value


def package_name(value, where: str, field: str = "package") -> str:
    return path_component(value, field, where, _PACKAGE)


def version(value, where: str, field: str = "version") -> str:
    return path_component(value, field, where, _VERSION)


def patch_name(value, where: str, field: str = "Patch-Name") -> str:
    if isinstance(value, str) and value and not SLUG.match(value):
        raise RebaseError(f"{where}: {field} {value!r} must be lowercase letters, digits, '.' and '-' "
                          f"(it names files and folders)")
    return path_component(value, field, where, SLUG)


def git_ref(value, where: str, field: str = "ref") -> str:
    not_an_option(value, field, where)
    if not _REF.match(value) or ".." in value or value.endswith(("/", ".lock")):
        raise RebaseError(f"{where}: {field} {value!r} is not a plain branch, tag or commit name")
    return value


def is_local_path(url: str) -> bool:
    """Whether git reads ``url`` as a path on this machine: no ``scheme://`` and no scp-style
    ``host:path`` (a colon before the first slash), the same rule git applies."""
    if "://" in url:
        return False
    colon, slash = url.find(":"), url.find("/")
    return colon == -1 or (slash != -1 and slash < colon)


def pinned_git_url(value, where: str) -> str:
    """A committed pin is read from every directory of the checkout (and by CI): a relative path
    would name a different repository from each, so a local path in a pin must be absolute."""
    url = git_url(value, where)
    if is_local_path(url) and not url.startswith("/"):
        raise RebaseError(f"{where}: url {url!r} is a relative local path; a pin names a URL or an "
                          f"absolute path (bump --mirror PATH keeps a canonical URL in the pin)")
    return url


def git_url(value, where: str, field: str = "url") -> str:
    not_an_option(value, field, where)
    if _HELPER.match(value):
        raise RebaseError(f"{where}: {field} {value!r} uses a git remote helper ('<name>::'); "
                          f"use a URL or a local path")
    return value


LINE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def line_name(value, where: str, field: str = "line name") -> str:
    """A line is a folder ``lines/<name>/`` and ``.rebase/lines/<name>/``: a plain lowercase name."""
    path_component(value, field, where)
    if not LINE_NAME.match(value):
        raise RebaseError(f"{where}: {field} {value!r} must be lowercase letters, digits, '.', '_' and '-', "
                          f"starting with a letter or digit")
    return value
