"""Where the conflicting code went, when blame of the conflict names no upstream commit.

Blame explains lines the new base still has, and the lines upstream deleted are matched against
the commits that touched the file; neither finds a file upstream renamed, deleted or moved
elsewhere, nor lines a merge commit took out. Here the search follows the code instead:

- the file itself: the oldest commit between the bases that renames or deletes it (``git log -M
  --diff-filter=RD`` over all paths, merges by their first parent when no plain commit does it);
- the lines: a few distinctive lines of the patch's context (``distinctive``) are looked up with
  ``git log -S`` on the file between the bases; a commit that removes one from the file and adds
  it to another file (any path) moved it there, one that only removes it deleted it.

Each finding is ``{"commit", "subject", "how"}``, ``how`` one of ``renamed to P``, ``moved to P``,
``deleted``, ``file deleted``. The search is bounded (``MAX_LINES`` strings, the range given), so a
stop on a large upstream range stays seconds, not minutes.
"""

import re

from tools.rebase.git.gitcmd import git, git_proc

MAX_LINES = 3  # distinctive lines searched per file
MIN_LENGTH = 16  # shorter lines (``return x``, ``else:``) occur everywhere
_SHA = re.compile(r"^[0-9a-f]{40}$")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")


def distinctive(lines, limit: int = MAX_LINES) -> list:
    """The longest lines of ``lines`` (stripped) that carry a name and are not comments or
    decorators alone: what ``git log -S`` can follow without matching half the tree."""
    seen, out = set(), []
    for text in sorted((ln.strip() for ln in lines), key=lambda t: (-len(t), t)):
        if len(text) < MIN_LENGTH or text in seen or text.startswith(("#", "@", '"""', "'''")):
            continue
        if not _WORD.search(text):
            continue
        seen.add(text)
        out.append(text)
        if len(out) == limit:
            break
    return out


def commit_subject(work, sha: str) -> str:
    """The subject line of ``sha``, "" when the repository does not hold it."""
    proc = git_proc("show", "-s", "--format=%s", sha, cwd=work)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _file_events(work, old: str, new: str, merges: bool) -> list:
    """``[(commit, status, source, target)]`` of renames and deletions between the bases, oldest
    first (plain commits, or merges against their first parent)."""
    args = ["log", "-M", "--reverse", "--diff-filter=RD", "--name-status", "--format=%x01%H"]
    args += ["--merges", "--diff-merges=first-parent"] if merges else ["--no-merges"]
    out = git(*args, f"{old}..{new}", cwd=work)
    events, sha = [], None
    for line in out.splitlines():
        if line.startswith("\x01"):
            sha = line[1:].strip()
        elif line and sha:
            parts = line.split("\t")
            if parts[0].startswith("R") and len(parts) == 3:
                events.append((sha, "R", parts[1], parts[2]))
            elif parts[0] == "D" and len(parts) == 2:
                events.append((sha, "D", parts[1], ""))
    return events


def _changes(work, sha: str, merge: bool) -> dict:
    """``{path: (removed lines, added lines)}`` (stripped) of one commit (a merge: against its
    first parent)."""
    args = ["show", "--no-color", "-U0", "--format=", "--no-renames"]
    if merge:
        args.append("--diff-merges=first-parent")
    out = git(*args, sha, cwd=work)
    found, path = {}, None
    for line in out.split("\n"):
        if line.startswith("diff --git"):
            path = None
        elif line.startswith("--- "):
            path = line[6:] if line.startswith("--- a/") else None
        elif line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else path
        elif path and line[:1] in "+-" and not line.startswith(("+++", "---")) and line[1:].strip():
            entry = found.setdefault(path, (set(), set()))
            entry[0 if line[0] == "-" else 1].add(line[1:].strip())
    return found


def _is_merge(work, sha: str) -> bool:
    return len(git("rev-list", "--parents", "-n", "1", sha, cwd=work).split()) > 2


def _moved_to(changes: dict, path: str, texts: set) -> str:
    """The other file of ``changes`` that gains most of ``texts`` (the lines ``path`` lost)."""
    best, best_n = "", 0
    for other, (_removed, added) in sorted(changes.items()):
        n = len(added & texts)
        if other != path and n > best_n:
            best, best_n = other, n
    return best


def _file_gone(work, old: str, new: str, path: str, texts: list) -> dict | None:
    """The commit that renamed or deleted ``path`` between the bases (with where its lines went)."""
    for merges in (False, True):
        for sha, status, source, target in _file_events(work, old, new, merges):
            if source != path:
                continue
            if status == "R":
                return {"commit": sha, "subject": commit_subject(work, sha), "how": f"renamed to {target}"}
            changes = _changes(work, sha, merges)
            to = _moved_to(changes, path, set(texts)) if texts else ""
            return {"commit": sha, "subject": commit_subject(work, sha),
                    "how": f"moved to {to}" if to else "file deleted"}
    return None


def _pickaxe(work, old: str, new: str, text: str, merges: bool, path: str) -> list:
    """Commits that change how often ``text`` occurs in ``path`` (a commit that took it out of
    ``path`` touches ``path``, so the search is limited to it; where it went is read per commit)."""
    args = ["log", "--reverse", "--format=%H", f"-S{text}"]
    args += ["--merges", "--diff-merges=first-parent"] if merges else ["--no-merges"]
    proc = git_proc(*args, "--no-patch", f"{old}..{new}", "--", path, cwd=work)
    return [s for s in proc.stdout.split() if _SHA.match(s)] if proc.returncode == 0 else []


def _lines_gone(work, old: str, new: str, path: str, texts: list) -> list:
    """Commits that took the distinctive ``texts`` out of ``path``: moved to another file or deleted."""
    found = {}
    for merges in (False, True):
        for text in texts:
            for sha in _pickaxe(work, old, new, text, merges, path):  # oldest first: the first to take it out
                if sha in found:
                    break
                changes = _changes(work, sha, merges or _is_merge(work, sha))
                removed = changes.get(path, (set(), set()))[0]
                if text not in removed:
                    continue  # it changed the count elsewhere, not here
                lost = {t for t in texts if t in removed}
                to = _moved_to(changes, path, lost)
                kept = text in changes.get(path, (set(), set()))[1]
                if kept and not to:
                    continue  # rewritten in place: blame's business
                found[sha] = {"commit": sha, "subject": commit_subject(work, sha),
                              "how": f"moved to {to}" if to else "deleted"}
                break  # a later commit removing it again (a sync merge built on this one) is not the cause
        if found:
            break
    return list(found.values())


def where_it_went(work, upstream_range, path: str, context: list, file_in_new: bool) -> list:
    """Findings (``{"commit", "subject", "how"}``) for ``path``, whose conflicting ``context``
    (lines of the patch's base side) blame could not tie to an upstream commit."""
    old, new = upstream_range
    if not old or not new:
        return []
    texts = distinctive(context)
    if not file_in_new:
        gone = _file_gone(work, old, new, path, texts)
        return [gone] if gone else []
    return _lines_gone(work, old, new, path, texts) if texts else []
