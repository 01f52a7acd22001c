"""Find a vanished patch anywhere upstream: its text in any file, or a re-implementation of it.

The path-limited upstream log only sees files the stacks touch. A patch upstream took into a new
file, or implemented again in its own words, is invisible there and would read as "dropped".
One whole-range scan answers both: the patch's added lines (indexed by fingerprint, the commit
that introduced the surviving text wins), and the identifiers the patch introduced (names absent
from the old base: config fields, functions, classes, CLI options) reappearing in one upstream
commit, backed by that commit's subject sharing the patch's words.
"""

import re

from tools.rebase.analysis import fingerprints
from tools.rebase.git.gitcmd import git_proc
from tools.rebase.analysis.subjects import strip_numbering, words

_IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
_OPTION = re.compile(r"--([a-z][a-z0-9]*(?:-[a-z0-9]+)+)")
MAX_IDENTIFIERS = 40  # per patch, the longest first
MIN_SHARED = 2  # introduced identifiers an upstream commit must also add ...
MIN_SHARE = 0.3  # ... and this share of them, or one plus the subject's words


def _distinctive(name: str) -> bool:
    """Names that identify a feature: snake_case or CamelCase, not short everyday words."""
    return len(name) >= 6 and ("_" in name.strip("_") or (name[0].isupper() and any(ch.islower() for ch in name)
                                                             and any(ch.isupper() for ch in name[1:])))


def candidate_identifiers(patch) -> list:
    """Distinctive names in the patch's added lines that its removed lines do not have."""
    added, removed = set(), set()
    for f in patch.files:
        for line in f.signed:
            if line[:1] not in "+-":
                continue
            found = set(_IDENT.findall(line[1:])) | {o.replace("-", "_") for o in _OPTION.findall(line)}
            (added if line[0] == "+" else removed).update(n for n in found if _distinctive(n))
    return sorted(added - removed, key=lambda n: (-len(n), n))[:MAX_IDENTIFIERS]


def _suffix(path: str) -> str:
    """``.py`` of ``a/b.py``; "" when the name has no suffix (then every file is scanned)."""
    name = path.rsplit("/", 1)[-1]
    return name[name.rindex("."):] if "." in name.lstrip(".") else ""


def present_in(repo, tree: str, names: list) -> set:
    """The names of ``names`` that occur as whole words in ``tree`` (one git grep)."""
    if not names:
        return set()
    args = ["grep", "-F", "-w", "-o", "-h", "-I"]
    for n in names:
        args += ["-e", n]
    proc = git_proc(*args, tree, cwd=repo)
    return {line.rpartition(":")[2].strip() for line in proc.stdout.splitlines()} & set(names)


def scan_suffixes(patches: list) -> tuple:
    """The file suffixes the scan keeps (code moves within its language); () = every file."""
    suffixes = {_suffix(f.path) for p in patches for f in p.files}
    return () if "" in suffixes else tuple(sorted(suffixes))


def start(repo, upstream_range: tuple, candidates: list) -> tuple:
    """Start the whole-range log for ``candidates`` in the background; ``search`` (or ``stop``)
    with the returned handle must follow."""
    suffixes = scan_suffixes(candidates)
    fingerprints.prefetch_range_log(repo, *upstream_range, suffixes)
    return upstream_range, suffixes


def stop(repo, handle: tuple) -> None:
    fingerprints.drop_range_log(repo, *handle[0], handle[1])


def search(repo, handle: tuple, patches: list, old_base: str) -> dict:
    """``{patch commit: (kind, upstream commit, subject, how)}``, kind "absorbed" (its text) or
    "likely" (a re-implementation), for the patches found. ``handle``: from ``start``."""
    upstream_range, suffixes = handle
    if not patches:
        stop(repo, handle)
        return {}
    texts = {t[1:] for p in patches for _, t in fingerprints.signed_norms(p) if t[0] == "+"}
    names = {p.commit: candidate_identifiers(p) for p in patches}
    old_known = present_in(repo, old_base, sorted({n for ns in names.values() for n in ns}))
    introduced = {sha: [n for n in ns if n not in old_known] for sha, ns in names.items()}
    index = fingerprints.scan_range(repo, *upstream_range, texts=texts,
                                    identifiers={n for ns in introduced.values() for n in ns}, suffixes=suffixes)
    found = {}
    for p in patches:
        hit = fingerprints.absorber(index, p)
        if hit:
            found[p.commit] = ("absorbed", *hit)
            continue
        likely = _reimplementation(index, p, introduced[p.commit])
        if likely:
            found[p.commit] = ("likely", *likely)
    return found


def _reimplementation(index, patch, introduced: list):
    per = {}
    for name in introduced:
        for k in index.identifiers.get(name, ()):
            per.setdefault(k, set()).add(name)
    own_words = words(strip_numbering(patch.subject)) - {"fix", "add", "support", "feat", "use"}
    best = None
    for k, shared in per.items():
        sha, subject = index.commits[k]
        title = own_words & words(strip_numbering(subject))
        enough = len(shared) >= MIN_SHARED and (len(shared) >= MIN_SHARE * len(introduced) or len(title) >= 2)
        if not (enough or (shared and len(title) >= 2)):
            continue
        score = (len(shared), len(title), k)
        if best is None or score > best[0]:
            best = (score, sha, subject, shared, title)
    if best is None:
        return None
    _, sha, subject, shared, title = best
    names = ", ".join(f"`{n}`" for n in sorted(shared, key=lambda n: (-len(n), n))[:6])
    how = f"same identifiers {names} ({len(shared)} of the {len(introduced)} it introduced)"
    if title:
        how += f"; its subject shares {', '.join(sorted(title))}"
    return sha, subject, how
