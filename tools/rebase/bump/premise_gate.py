"""Before the replay: the line's premise and the reasons of its drops, re-checked on the new base
(``analysis/premise.py``). A bump onto a base that breaks either is refused, everything restored,
and the message says what broke; ``--allow-broken-premise`` goes on anyway (a rehearsal, or a
maintainer who will rework the line), and the dry run lists them as warnings."""

from tools.rebase.analysis.premise import drop_problems, premise_problems
from tools.rebase.bump import journal as jr
from tools.rebase.bump.prepare import _pin_from_toml
from tools.rebase.errors import RebaseError
from tools.rebase.stack.drops import read_drops
from tools.rebase.stack.premise import premise_path, read_premise


class PremiseGate:
    """Mixin of ``Bump`` (uses ``layout``, ``lend_home``, ``work``, ``j``, ``log``, ``allow_broken_premise``)."""

    def _premise_problems(self) -> list:
        j = self.j
        symbols = read_premise(self.lend_home)  # the line's real home: a dry run's scratch copies only patches/
        old_pin, new_pin = _pin_from_toml(j.old_pin), _pin_from_toml(j.new_pin)
        history = (old_pin.commit, new_pin.commit) if old_pin.kind == new_pin.kind == "git" else None
        return (premise_problems(self.work, j.new_base, symbols)
                + drop_problems(self.work, j.old_base, j.new_base, read_drops(self.layout), history))

    def _check_premise(self) -> None:
        self.premise_broken = self._premise_problems()
        if not self.premise_broken:
            return
        if not self.allow_broken_premise:
            jr.restore(self.layout)  # as `bump --abort` does: the backup was made a moment ago
            jr.finish(self.layout)
            home = self.lend_home
            raise RebaseError(
                "refusing to bump: the new base breaks what the line relies on:\n"
                + "".join(f"  {p}\n" for p in self.premise_broken)
                + f"Nothing was changed. Rework the line (bring back a patch whose drop no longer holds, "
                  f"update {home.rel(premise_path(home))}), or pass --allow-broken-premise to bump anyway.")
        for problem in self.premise_broken:
            self.log(f"warning: {problem} (--allow-broken-premise)")
