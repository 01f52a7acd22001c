"""Phase 4, the finish: reproducible commit ids, the new pin, the exported ``patches/``, the
README's patch table, the last-bump record and refs, and the review report (computed from the
commits in the background while the rest is written)."""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tools.rebase.analysis.classify import prefetch_range_diff
from tools.rebase.analysis.diffparse import prefetch_range
from tools.rebase.bump import journal as jr
from tools.rebase.bump import rerere_store as rr
from tools.rebase.bump.commits import _describe, _to_branch, canonical_chain
from tools.rebase.bump.package_copy import restore_package
from tools.rebase.bump.prepare import _base_label, _pin_from_toml
from tools.rebase.git.gitcmd import git
from tools.rebase.git.safefs import write_file
from tools.rebase.report.report import build_report, write_report
from tools.rebase.stack.drops import read_drops
from tools.rebase.stack.pin import load_pin
from tools.rebase.stack.stack import prefetch_export

LAST_OLD_REF = "refs/rebase/last-bump/old"
LAST_NEW_REF = "refs/rebase/last-bump/new"


def _prefetch_finish(work: Path, j, tip: str) -> None:
    """Start the finish's read-only git work on ``new_base..tip`` (used if the bump ends there)."""
    prefetch_range(work, j.new_base, tip)
    prefetch_export(work, j.new_base, tip)
    prefetch_range_diff(work, j.old_base, j.old_tip, j.new_base, tip)


def _export(layout, base: str, tip: str) -> list:
    """Write patches/ (and the tool state) for base..tip; ``megatron/`` is left to ``apply``."""
    from tools.rebase.stack.workrepo import write_patches

    return write_patches(layout, load_pin(layout.pin), base, tip)[1]


class FinishPhase:
    """Mixin of ``Bump`` (uses ``layout``, ``work``, ``log``, ``hook``, ``j`` and ``_save``)."""

    def _finish(self):
        j, layout, work = self.j, self.layout, self.work
        new_pin = _pin_from_toml(j.new_pin)
        old_pin = _pin_from_toml(j.old_pin)
        tip = canonical_chain(work, j.new_base, j.tip)
        if tip != j.tip:
            j.tip = tip
            self._save()
        tests = {}
        by_name = {}
        if j.tests:
            by_name = {n: c for c, n, _ in _describe(work, j.new_base, j.tip)}
        for name, outcome in j.tests.items():
            if name in by_name and outcome:
                tests[by_name[name]] = outcome
        hints = {"absorbed": {}, "dropped": [], "notes": {}, "drop_notes": {}}
        for o in j.outcomes:
            if o.outcome == "absorbed":
                hints["absorbed"][o.old] = [o.upstream, o.how]
            elif o.outcome == "dropped":
                hints["dropped"].append(o.old)
                hints["drop_notes"][o.old] = o.note
            elif o.note and o.new:
                hints["notes"][o.new] = o.note
        record = {
            "old_pin": j.old_pin, "new_pin": j.new_pin,
            "old_base": j.old_base, "old_tip": j.old_tip,
            "new_base": j.new_base, "new_tip": j.tip,
            "hints": hints, "tests": tests,
        }
        # The report only reads commits: it is computed while the pin, branch, patches/, README
        # and record are written (same writes, order and kill points as before; it is joined
        # before the report files are written, and on an error too).
        with ThreadPoolExecutor(max_workers=1) as pool:
            report_job = pool.submit(report_from_record, work, record)
            write_file(layout.root, layout.pin, j.new_pin)
            self.hook("after-pin")
            _to_branch(work, j.tip)
            patches = _export(layout, j.new_base, j.tip)
            self.hook("after-export")
            # A line keeps the resolutions of the patches it drops on purpose: its next refresh
            # brings them back (seed), and a drop taken back needs them again.
            rr.prune(layout.resolutions, {p.name for p in patches} | set(read_drops(layout)))
            from tools.rebase.proof.listing import BEGIN, read_readme, update_readme

            readme = layout.readme
            if readme.is_file() and BEGIN in read_readme(readme):
                update_readme(layout)  # the patch table names the base; keep check green
            git("update-ref", "--stdin", cwd=work,
                input=f"update {LAST_OLD_REF} {j.old_tip}\nupdate {LAST_NEW_REF} {j.tip}\n")
            last = jr.last_bump_dir(layout)
            write_file(layout.root, last / "record.json", json.dumps(record, indent=2, sort_keys=True) + "\n")
            data = report_job.result()
        write_report(data, layout.report_md, layout.report_json)
        self.hook("after-report")
        if j.materialized and restore_package(layout, self.log):
            self.hook("after-package-restore")
        from tools.rebase.bump.undo_hint import undo_hint

        undo = undo_hint(layout)  # compares the backup with the checkout's last commit: before it goes
        jr.finish(layout)
        counts = ", ".join(f"{n} {s}" for s, n in data["counts"].items() if n)
        self.log(f"bump done: {_base_label(old_pin)} -> {_base_label(new_pin)}; {counts}; "
                 f"wrote {layout.report_md.name} and {layout.report_json.name}; "
                 f"run `python -m tools.rebase apply{layout.line_flag}` to materialize megatron/")
        self.log(f"bump: {undo}")
        return data


def report_from_record(work: Path, record: dict, tests=None) -> dict:
    old_pin, new_pin = _pin_from_toml(record["old_pin"]), _pin_from_toml(record["new_pin"])
    upstream_range = (old_pin.commit, new_pin.commit) if old_pin.kind == new_pin.kind == "git" else None
    return build_report(work, record["old_base"], record["old_tip"], record["new_base"], record["new_tip"],
                        old_pin=old_pin, new_pin=new_pin, upstream_range=upstream_range,
                        hints=record.get("hints"), tests=tests if tests is not None else record.get("tests"),
                        trusted=True)
