"""Absorbed-by: whether a patch is already in the new base, and which upstream commit carries it
(only when both bases are git commits: an sdist has no history to search)."""

from tools.rebase.analysis.diffparse import find_absorbing_commit, list_range, upstream_commits
from tools.rebase.bump.commits import _files_of
from tools.rebase.bump.prepare import _pin_from_toml
from tools.rebase.analysis.whereabouts import reverse_applies


class AbsorbedBy:
    """Mixin of ``Bump`` (uses ``work``, ``j``; caches the upstream candidates)."""

    def _upstream_candidates(self):
        j = self.j
        old_pin, new_pin = _pin_from_toml(j.old_pin), _pin_from_toml(j.new_pin)
        if old_pin.kind != "git" or new_pin.kind != "git":
            return None
        if not hasattr(self, "_candidates"):
            paths = sorted({p for c in j.commits for p in _files_of(self.work, c)})
            self._candidates = upstream_commits(self.work, old_pin.commit, new_pin.commit, paths)
        return self._candidates

    def _absorbed_by(self, idx):
        """(upstream commit or "", how) if patch idx is already in the new base, else None."""
        work, j = self.work, self.j
        commit = j.commits[idx]
        patch = list_range(work, f"{commit}^", commit)[0]
        candidates = self._upstream_candidates()
        if candidates:
            found, how = find_absorbing_commit(work, patch, candidates)
            if found and how == "same patch-id":
                return found, how
        if reverse_applies(work, j.tip, patch.diff):
            found, how = find_absorbing_commit(work, patch, candidates or [])
            return found or "", "already applied: its reverse applies to the new tree" + (
                f"; carried by upstream {found[:12]} ({how})" if found else "")
        return None

    def _name_absorber(self, idx, why):
        candidates = self._upstream_candidates()
        if not candidates:
            return "", why
        commit = self.j.commits[idx]
        patch = list_range(self.work, f"{commit}^", commit)[0]
        found, how = find_absorbing_commit(self.work, patch, candidates)
        return (found, f"{why}; {how}") if found else ("", why)
