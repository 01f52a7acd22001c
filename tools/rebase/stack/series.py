"""The series file and the patch files it names: parsing, trailers and structural validation.

Validation happens before anything is applied, so a malformed or unsafe patch never leaves a
half-applied work repo; every problem names the file and, where possible, the line.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tools.rebase.git import names
from tools.rebase.git.safefs import read_nofollow
from tools.rebase.stack import mailheaders
from tools.rebase.errors import RebaseError

FILE_NAME = re.compile(r"^(?P<number>\d{4})-(?P<slug>[a-z0-9][a-z0-9.-]*)\.patch$")
SLUG = names.SLUG
REQUIRED_TRAILERS = ("Patch-Name", "Upstream-Status", "Tests")
UPSTREAM_STATUS_WORDS = ("fork-only", "not-submitted", "submitted", "accepted")
_TRAILER = re.compile(r"^(?P<key>[A-Za-z][A-Za-z0-9-]*): ?(?P<value>.*)$")
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class SeriesEntry:
    name: str  # file name as written in series
    line: int  # 1-based line in series
    comments: list = field(default_factory=list)  # comment/blank lines directly above


@dataclass
class Series:
    entries: list
    trailing: list  # comment lines after the last entry

    @property
    def names(self):
        return [e.name for e in self.entries]


def _refuse_link(path: Path) -> None:
    """A committed link would make the tool read a file from outside the checkout."""
    if path.is_symlink():
        raise RebaseError(f"{path}: must not be a symlink (patches/ holds plain files)")


def read_series(path: Path) -> Series:
    _refuse_link(path)
    if not path.is_file():
        raise RebaseError(f"{path}: series file is missing")
    entries, pending = [], []
    try:
        text = read_nofollow(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RebaseError(f"{path}: not UTF-8 ({exc})") from None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            pending.append(raw.rstrip())
            continue
        if any(c.isspace() for c in text):
            raise RebaseError(f"{path}:{lineno}: one patch file name per line, got {text!r}")
        # A name, never a path: apply would otherwise take a patch file from anywhere.
        names.path_component(text, "patch file", f"{path}:{lineno}")
        entries.append(SeriesEntry(text, lineno, pending))
        pending = []
    return Series(entries, pending)


def render_series(names, old: Series | None = None, header=None) -> str:
    """Write ``names`` in order, keeping comments that sat above an entry with the same slug."""
    by_slug = {}
    lines = []
    if old is not None and not old.entries:  # only comments so far: they are the header
        header, old = old.trailing, None
    if old is not None:
        for entry in old.entries:
            m = FILE_NAME.match(entry.name)
            by_slug[m["slug"] if m else entry.name] = entry.comments
    elif header:
        lines.extend(header)
    for name in names:
        m = FILE_NAME.match(name)
        lines.extend(by_slug.get(m["slug"] if m else name, []))
        lines.append(name)
    if old is not None:
        lines.extend(old.trailing)
    return "\n".join(lines) + "\n"


@dataclass
class PatchFile:
    path: Path
    subject: str
    message: str  # full commit message (subject + body)
    trailers: dict  # key -> list of values
    files: list  # paths touched
    added: int
    removed: int
    # (line in the patch file, file changed, line in the new file) of every added line
    added_at: list = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.trailers.get("Patch-Name", [""])[0]

    @property
    def tests(self):
        return test_ids(self.trailers)

    @property
    def upstream_status(self) -> str:
        return self.trailers.get("Upstream-Status", [""])[0]


def test_ids(trailers: dict) -> list:
    """The node ids of the ``Tests:`` trailers (one or more per line, split on spaces and commas)."""
    out = []
    for value in trailers.get("Tests", []):
        out.extend(v for v in re.split(r"[\s,]+", value) if v)
    return out


def parse_trailers(message: str) -> dict:
    """Trailers are the ``Key: value`` lines of the message's last paragraph."""
    paragraphs = [p for p in re.split(r"\n\s*\n", message.strip()) if p.strip()]
    if len(paragraphs) < 2:
        return {}
    found = []  # (key, [value, folded continuations...]): joined once, in linear time
    for line in paragraphs[-1].splitlines():
        m = _TRAILER.match(line)
        if m:
            found.append((m["key"], [m["value"].strip()]))
        elif line[:1].isspace() and found:  # folded continuation
            found[-1][1].append(line.strip())
        else:
            return {}
    trailers = {}
    for key, values in found:
        trailers.setdefault(key, []).append(" ".join(values))
    return trailers


def _is_git_dir(part: str) -> bool:
    """``.git`` as case-insensitive file systems (and NTFS short names / trailing dots) see it."""
    folded = part.lower().rstrip(". ")
    return folded == ".git" or folded.startswith("git~")


def _unsafe_path(path: str) -> bool:
    if path == "/dev/null":
        return False
    p = PurePosixPath(path)
    return (p.is_absolute() or ".." in p.parts or any(_is_git_dir(x) for x in p.parts)
            or path.startswith("~") or "\\" in path or any(ord(c) < 32 for c in path))


_C_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _c_unquote(token: str) -> str:
    """Undo git's C-style quoting of a path (``"a/\\303\\251.py"``); unquoted tokens pass through."""
    if len(token) < 2 or not (token.startswith('"') and token.endswith('"')):
        return token
    body, out, i = token[1:-1], bytearray(), 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out += c.encode()
            i += 1
        elif body[i + 1:i + 4].isdigit() and len(body[i + 1:i + 4]) == 3:
            out.append(int(body[i + 1:i + 4], 8) & 0xFF)
            i += 4
        else:
            out.append(_C_ESCAPES.get(body[i + 1:i + 2], ord("?")))
            i += 2
    return out.decode("utf-8", "replace")


def _strip_prefix(token: str, prefix: str) -> str:
    token = _c_unquote(token)
    return token[len(prefix):] if token.startswith(prefix) else token


def parse_patch(path: Path) -> PatchFile:
    """Parse a ``git format-patch`` file; raise RebaseError naming file:line on any defect."""
    where = str(path)
    _refuse_link(path)
    try:
        text = read_nofollow(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RebaseError(f"{where}: not UTF-8 ({exc})") from None
    lines = text.split("\n")
    if not lines[0].startswith("From "):
        raise RebaseError(f"{where}:1: not a git format-patch file (first line must be 'From <sha> ...')")
    headers, i = mailheaders.read_headers(where, lines)
    subject = headers["subject"]
    body_start = i + 1
    diff_start = None
    for j in range(body_start, len(lines)):
        if _patch_break(lines[j]):
            diff_start = j
            break
    if diff_start is None:
        raise RebaseError(f"{where}: no diff found (expected a '---' line followed by 'diff --git')")
    body = "\n".join(lines[body_start:diff_start]).strip("\n")
    message = subject + ("\n\n" + body if body else "")
    added_at = []
    files, added, removed = _check_diff(where, lines, diff_start, added_at)
    if not files:
        raise RebaseError(f"{where}: the patch changes no files")
    trailers = parse_trailers(message)
    for value in trailers.get("Patch-Name", [])[:1]:
        names.patch_name(value, where)
    return PatchFile(path, subject, message, trailers, files, added, removed, added_at)


# Top-level files (outside megatron/) a patch may touch: none, since every patch of the series
# changes the package only. A patch adding tools/, upstream.toml or setup.py to the work tree would
# otherwise turn `python -m tools.rebase` run from .rebase/work into the patch's own code.
TOP_LEVEL_FILES = ()
PACKAGE_PREFIX = "megatron/"
# Files that make git itself read configuration from the tree (attributes pick diff/merge
# drivers and filters; .gitmodules names repositories to clone).
_GIT_CONTROL = (".gitattributes", ".gitmodules")
_EXTENDED_HEADER = ("old mode ", "new mode ", "deleted file mode ", "new file mode ", "similarity index ",
                    "dissimilarity index ", "rename from ", "rename to ", "copy from ", "copy to ", "index ")
# What git apply (inside git am) reads as a patch, wherever it appears after the message.
_PATCH_LIKE = re.compile(r"^(--- |\+\+\+ |@@ |Index: |diff |\*\*\* |Binary files |GIT binary patch|"
                         r"rename |copy |new file mode|deleted file mode|old mode|new mode|similarity index)")
_ALLOWED_MODES = (0o100644, 0o100755)


def _check_mode(where, lineno, line):
    value = line.rsplit(" ", 1)[-1]
    try:
        mode = int(value, 8)
    except ValueError:
        raise RebaseError(f"{where}:{lineno}: cannot read the file mode in {line!r}") from None
    if mode == 0o120000:
        raise RebaseError(f"{where}:{lineno}: refusing a symlink (mode 120000): the package must "
                          f"not contain symlinks")
    if mode == 0o160000:
        raise RebaseError(f"{where}:{lineno}: refusing a gitlink (mode 160000, a submodule): the "
                          f"package holds plain files only")
    if mode not in _ALLOWED_MODES:
        raise RebaseError(f"{where}:{lineno}: refusing file mode {value} (only 100644 and 100755)")


def _check_target(where, lineno, path):
    """A patch changes files of the package (and the named top-level files) only."""
    if path == "/dev/null":
        return
    leaf = PurePosixPath(path).name.lower().rstrip(". ")
    if leaf in _GIT_CONTROL:
        raise RebaseError(f"{where}:{lineno}: refusing {path!r}: a patch must not add or change "
                          f"{leaf} (git would take diff/merge drivers or submodules from it)")
    if not path.startswith(PACKAGE_PREFIX) and path not in TOP_LEVEL_FILES:
        allowed = f" or the top-level files {', '.join(TOP_LEVEL_FILES)}" if TOP_LEVEL_FILES else ""
        raise RebaseError(f"{where}:{lineno}: refusing {path!r}: patches change files under "
                          f"{PACKAGE_PREFIX}{allowed} only (the work tree's other files would be "
                          f"code a command run there picks up)")


def _patch_break(line: str) -> bool:
    """Where git am's mailinfo ends the message and starts reading the patch."""
    return (line.startswith(("diff -", "Index: ")) or re.match(r"^---\s*$", line) is not None
            or re.match(r"^--- \S", line) is not None)


def _check_diff(where, lines, start, added_at):
    """Validate everything ``git am`` will apply from line ``start`` on: only ``diff --git``
    sections with known header lines and hunks whose counts match; any other line that git apply
    would take as (part of) a patch is an error, wherever it sits. Each added line's place is
    appended to ``added_at``."""
    files, added, removed = [], 0, 0
    i = start + (1 if lines[start] == "---" else 0)
    n = len(lines)
    section = None  # (a, b) of the open diff --git section
    in_header = False
    while i < n:
        line = lines[i]
        if line.startswith("diff --git "):
            parts = line[len("diff --git "):].split(" ")
            if len(parts) != 2:
                raise RebaseError(f"{where}:{i + 1}: cannot parse file names in {line!r}")
            a, b = _strip_prefix(parts[0], "a/"), _strip_prefix(parts[1], "b/")
            for p in (a, b):
                if _unsafe_path(p):
                    raise RebaseError(f"{where}:{i + 1}: refusing path outside the tree: {p!r}")
                _check_target(where, i + 1, p)
            files.append(b)
            section, in_header = (a, b), True
            i += 1
            continue
        if line.startswith(("Binary files ", "GIT binary patch")):
            raise RebaseError(f"{where}:{i + 1}: refusing a binary change ({line[:60]!r}): its content "
                              f"is not in the patch; the package holds text files only")
        if section is None or not in_header:
            if line.startswith("@@") and section is not None:
                pass  # another hunk of the open section
            elif line == "" or line.startswith("\\") or (section is None and not _PATCH_LIKE.match(line)):
                i += 1  # a diffstat before the first file; git apply skips it
                continue
            else:
                what = "before the first 'diff --git'" if section is None else "between two files"
                raise RebaseError(f"{where}:{i + 1}: unexpected line {what}: {line[:60]!r} (git am would "
                                  f"read {'it as a patch' if _PATCH_LIKE.match(line) else 'past it'}; "
                                  f"only format-patch's own lines may follow the message)")
        if in_header and line == "":
            in_header = False  # a header without hunks (a pure rename or mode change) ends here
            i += 1
            continue
        if in_header and not line.startswith("@@"):
            if line.startswith(("new file mode ", "new mode ", "old mode ", "deleted file mode ")):
                _check_mode(where, i + 1, line)
            elif line.startswith("index ") and line.count(" ") == 2:
                _check_mode(where, i + 1, line)
            elif line.startswith(("--- ", "+++ ")):
                prefix, expected = ("a/", section[0]) if line.startswith("-") else ("b/", section[1])
                p = _strip_prefix(line[4:].split("\t")[0], prefix)
                if _unsafe_path(p):
                    raise RebaseError(f"{where}:{i + 1}: refusing path outside the tree: {p!r}")
                if p not in ("/dev/null", expected):
                    raise RebaseError(f"{where}:{i + 1}: {line[:4]}names {p!r}, but its 'diff --git' "
                                      f"line names {expected!r}")
            elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
                p = _strip_prefix(line.split(" ", 2)[2], "")
                if _unsafe_path(p):
                    raise RebaseError(f"{where}:{i + 1}: refusing path outside the tree: {p!r}")
                _check_target(where, i + 1, p)
            elif not line.startswith(_EXTENDED_HEADER):
                raise RebaseError(f"{where}:{i + 1}: unexpected line in the header of "
                                  f"{section[1]!r}: {line[:60]!r}")
            i += 1
            continue
        m = _HUNK.match(line)
        if not m:
            raise RebaseError(f"{where}:{i + 1}: malformed hunk header {line[:60]!r}")
        in_header = False
        old_len = int(m[2]) if m[2] is not None else 1
        new_len = int(m[4]) if m[4] is not None else 1
        new_no = int(m[3])
        header_line = i + 1
        i += 1
        while old_len > 0 or new_len > 0:
            if i >= n:
                raise RebaseError(
                    f"{where}:{header_line}: hunk ends early (file ends with {old_len} old and "
                    f"{new_len} new lines still expected)"
                )
            h = lines[i]
            tag = h[:1]
            if tag == " " or (h == "" and i + 1 < n):
                old_len -= 1
                new_len -= 1
                new_no += 1
            elif tag == "-":
                old_len -= 1
                removed += 1
            elif tag == "+":
                new_len -= 1
                added += 1
                added_at.append((i + 1, section[1], new_no))
                new_no += 1
            elif tag == "\\":
                pass
            else:
                raise RebaseError(
                    f"{where}:{i + 1}: hunk starting at line {header_line} has "
                    f"{old_len} old / {new_len} new lines missing before {h[:40]!r}"
                )
            if old_len < 0 or new_len < 0:
                raise RebaseError(
                    f"{where}:{header_line}: hunk line counts do not match its @@ header"
                )
            i += 1
        while i < n and lines[i].startswith("\\"):
            i += 1
    return files, added, removed


def load_stack(layout):
    """Read the series and parse every patch it names; return (series, [PatchFile])."""
    series = read_series(layout.series)
    patches = []
    seen = {}
    for entry in series.entries:
        where = f"{layout.series}:{entry.line}"
        if entry.name in seen:
            raise RebaseError(f"{where}: {entry.name} is listed twice (first on line {seen[entry.name]})")
        seen[entry.name] = entry.line
        path = layout.patches / entry.name
        if not path.is_file():
            raise RebaseError(f"{where}: {entry.name} does not exist in {layout.patches}")
        patches.append(parse_patch(path))
    return series, patches
