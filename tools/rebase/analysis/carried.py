"""Whether the new base carries an old patch's change: its added lines there, its removed lines gone.

The searches for where an unclaimed patch went read upstream *history*: a commit that touched the
same function, added the same names, removed the same lines. History alone misreads two cases a
reviewer meets on every large bump. A patch the fork dropped (moved to another repository, a fix it
no longer needs) read as likely absorbed because upstream touched the same code, though the new
base has none of its change; and a patch upstream took in its own version (the same lines
replaced, part of the text reworded) read as only *likely* absorbed though its commit was found.
The new base's files settle both:

- ``absent``: the new base has none of the change. Its removed lines are mostly still there and
  none of its added lines is; or it only adds lines, none is there and none of the names it
  introduced exists anywhere in the new base. Such a patch is never absorbed or likely absorbed.
- ``carried``: its removed lines are mostly gone and a good part of its added lines is there:
  with an upstream commit named, it is absorbed by that commit.
- ``touched``: anything between, where a re-implementation may stand (likely absorbed).
"""

import re
from collections import Counter
from dataclasses import dataclass

from tools.rebase.analysis.attribution import sided
from tools.rebase.analysis.lint import read_blobs
from tools.rebase.analysis.upstream_search import candidate_identifiers, present_in

GONE_SHARE = 0.5  # share of its removed lines the new base must have lost
PRESENT_SHARE = 0.25  # share of its added lines the new base must have, to carry it
NAMES_SHARE = 0.3  # share of the names a pure addition introduced the new base must hold
_PICKED = re.compile(r"\(cherry picked from commit ([0-9a-f]{7,64})\)")


@dataclass
class Carried:
    added: int = 0  # meaningful added lines
    present: int = 0  # of them, gained by the new base in the same file
    removed: int = 0  # meaningful removed lines
    gone: int = 0  # of them, lost by the new base
    names: int = 0  # distinctive names the patch introduced (pure additions only)
    names_there: int = 0  # of them, anywhere in the new base

    @property
    def verdict(self) -> str:
        if not self.added and not self.removed:
            return "touched"  # no line to judge by (an empty file, a mode change)
        if self.removed and self.gone < GONE_SHARE * self.removed and not self.present:
            return "absent"
        if not self.removed and not self.present and self.names_there < max(1, NAMES_SHARE * self.names):
            return "absent"
        if self.gone >= GONE_SHARE * self.removed and self.present >= PRESENT_SHARE * self.added and (
                self.present or not self.added):
            return "carried"
        return "touched"

    def describe(self) -> str:
        parts = []
        if self.added:
            parts.append(f"{self.present} of its {self.added} added lines are in the new base")
        if self.removed:
            parts.append(f"{self.removed - self.gone} of its {self.removed} removed lines are still there")
        if not self.removed and not self.present:
            parts.append(f"{self.names_there} of the {self.names} names it introduced exist there")
        return ", ".join(parts)


def _counts(text) -> Counter:
    return Counter(line.strip() for line in (text or "").splitlines() if line.strip())


def measure(repo, old_base: str, new_base: str, patches: dict, in_base: dict) -> dict:
    """``{index: Carried}`` for ``patches`` (``{index: Commit}`` of the old stack); ``in_base``: the
    added lines the new base gained, per index (``inbase.lines_in_base``)."""
    if not patches:
        return {}
    paths = sorted({p for c in patches.values() for f in c.files for p in (f.path, f.old_path)})
    blobs = read_blobs(repo, [f"{rev}:{p}" for p in paths for rev in (old_base, new_base)])
    lost = {p: _counts(blobs[f"{old_base}:{p}"]) - _counts(blobs[f"{new_base}:{p}"]) for p in paths}
    wanted = {i: candidate_identifiers(c) for i, c in patches.items() if not sided(c)[1]}
    every = sorted({n for ns in wanted.values() for n in ns})
    before, after = present_in(repo, old_base, every), present_in(repo, new_base, every)
    out = {}
    for i, c in patches.items():
        plus, minus = sided(c)
        found = Carried(added=sum(plus.values()), present=sum(in_base.get(i, Counter()).values()),
                        removed=sum(minus.values()))
        for f in c.files:
            left = lost.get(f.old_path, Counter())
            for line in f.signed:
                text = line[1:].strip()
                if line[:1] == "-" and minus.get(text) and left.get(text, 0) > 0:
                    left[text] -= 1  # one lost line accounts for one removed line
                    found.gone += 1
        introduced = [n for n in wanted.get(i, []) if n not in before]
        found.names, found.names_there = len(introduced), sum(n in after for n in introduced)
        out[i] = found
    return out


def picked_from(patch, upstream: list) -> str:
    """The upstream commit (of ``upstream``) the patch's ``(cherry picked from commit X)`` line
    names, or "": the commit it came from is found by identity, whatever its text became."""
    for sha in _PICKED.findall(patch.message):
        for u in upstream:
            if u.commit.startswith(sha):
                return u.commit
    return ""
