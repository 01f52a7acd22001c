"""``bump``: move the patch stack onto a new upstream base, one patch at a time.

Each patch commit is replayed with a 3-way merge (``git cherry-pick``, rerere on, recorded
resolutions from ``patches/resolutions/`` loaded first). Per patch the outcome is one of:

- clean: replayed without conflict;
- resolved (recorded): rerere resolved every conflict; the patch's ``Tests:`` are re-run later;
- resolved (by hand): the bump stopped, the maintainer resolved and ran ``bump --continue``;
- absorbed: the change is already in the new base (empty after replay or after resolution, its
  reverse applies to the new tree, or an upstream commit between the bases carries the same
  patch-id); the upstream commit is named when one can be found;
- dropped: the maintainer removed it on purpose (``bump --continue --drop`` at its conflict).

Progress lives in the journal (``journal.py``), so a bump can be continued or aborted after being
killed at any point. On success the pin is updated, ``patches/`` exported, and the report
regenerated.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tools.rebase import journal as jr
from tools.rebase import resolutions as rr
from tools.rebase.diffparse import find_absorbing_commit, list_range, upstream_commits
from tools.rebase.errors import RebaseError
from tools.rebase.gitcmd import git, git_proc, is_clean, rev_parse
from tools.rebase.materialize import materialize
from tools.rebase.pin import Pin, load_pin, parse_spec, pin_from_table
from tools.rebase.report import build_report, reverse_applies, write_report
from tools.rebase.source import download_sdist, import_base, resolve_git_ref, sha256_file

LAST_OLD_REF = "refs/rebase/last-bump/old"
LAST_NEW_REF = "refs/rebase/last-bump/new"


class Stopped(RebaseError):
    """The bump stopped and waits for the maintainer (conflict or failing tests)."""


def _no_hook(point, **info):
    pass


# ---------------------------------------------------------------- tests

def pytest_runner(layout, name: str, node_ids: list) -> dict:
    """Run each node id with pytest in the checkout (``megatron/`` is the bumped tree)."""
    results = {}
    for node in node_ids:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", node],
            cwd=layout.root, capture_output=True, text=True,
        )
        results[node] = "passed" if proc.returncode == 0 else (
            "not found" if proc.returncode in (4, 5) else "failed")
    return results


# ---------------------------------------------------------------- helpers

def _pin_from_toml(text: str) -> Pin:
    import tomllib

    return pin_from_table(tomllib.loads(text)["upstream"], where="bump journal")


def resolve_spec(layout, spec: str) -> Pin:
    kind, a, b = parse_spec(spec)
    if kind == "pypi":
        path = download_sdist(layout.cache, a, b)
        return Pin("pypi", package=a, version=b, sha256=sha256_file(path))
    url = a
    local = Path(url).expanduser()
    if local.exists():
        url = str(local.resolve())
    commit = resolve_git_ref(layout.cache, url, b)
    return Pin("git", url=url, commit=commit, ref="" if b == commit else b)


def _author_date(work: Path, commit: str) -> str:
    return git("show", "-s", "--date=raw", "--format=%ad", commit, cwd=work).strip()


def _unmerged(work: Path) -> list:
    out = git("diff", "--name-only", "--diff-filter=U", cwd=work)
    return sorted(set(out.split()))


def _marker_files(work: Path) -> list:
    """Staged files that still carry conflict markers."""
    out = git("diff", "--cached", "--no-color", "-U0", cwd=work)
    bad, current = set(), None
    for line in out.splitlines():
        if line.startswith("+++ b/"):
            current = line[6:]
        elif line.startswith(("+<<<<<<< ", "+>>>>>>> ")) and current:
            bad.add(current)
    return sorted(bad)


def _staged_changes(work: Path) -> bool:
    return git_proc("diff", "--cached", "--quiet", cwd=work).returncode != 0


def _commit_pick(work: Path, original: str) -> str:
    env = {"GIT_COMMITTER_DATE": _author_date(work, original)}
    git("commit", "-q", "--no-verify", "--allow-empty-message", "-C", original, cwd=work, env=env)
    return git("rev-parse", "HEAD", cwd=work).strip()


def _reset_to(work: Path, commit: str) -> None:
    for args in (("cherry-pick", "--quit"), ("merge", "--quit")):
        git_proc(*args, cwd=work)
    rr.forget_in_progress(work)
    git("reset", "-q", "--hard", commit, cwd=work)
    git("clean", "-q", "-fd", cwd=work)


def _base_label(pin: Pin) -> str:
    return f"{pin.package} {pin.version}" if pin.kind == "pypi" else f"{pin.url}@{(pin.ref or pin.commit[:12])}"


# ---------------------------------------------------------------- the bump

class Bump:
    def __init__(self, layout, log=print, test_runner=pytest_runner, hook=_no_hook, run_tests=True):
        self.layout = layout
        self.work = layout.work
        self.log = log
        self.test_runner = test_runner
        self.hook = hook
        self.run_tests = run_tests
        self.j = None

    # -- journal helpers
    def _save(self):
        jr.save(self.layout, self.j)

    def start(self, spec: str):
        from tools.rebase.workrepo import apply

        layout = self.layout
        existing = jr.load(layout)
        if existing:
            raise RebaseError(
                f"a bump onto {existing['onto']} is already in progress ({existing['phase']}); "
                f"run `python -m tools.rebase bump --continue` or `bump --abort` first"
            )
        old_pin = load_pin(layout.pin)
        new_pin = resolve_spec(layout, spec)
        if new_pin == old_pin:
            raise RebaseError(f"the stack is already on {new_pin.display}; nothing to bump")
        apply(layout, log=lambda *_: None)  # work repo == patches/ (refuses unexported work)
        work = self.work
        old_base = import_base(work, layout.cache, old_pin)
        old_tip = git("rev-parse", "HEAD", cwd=work).strip()
        commits = git("rev-list", "--reverse", f"{old_base}..{old_tip}", cwd=work).split()
        names = [_patch_name(work, c) for c in commits]
        self.j = jr.begin(layout, {
            "onto": spec, "phase": "replaying",
            "old_pin": old_pin.to_toml(), "new_pin": new_pin.to_toml(),
            "old_base": old_base, "old_tip": old_tip, "commits": commits, "names": names,
            "next": 0, "tip": None, "new_base": None, "outcomes": [], "stopped": None,
            "materialized": False, "tests": {},
        })
        self.hook("after-backup")
        new_base = import_base(work, layout.cache, new_pin)
        self.j["new_base"] = new_base
        self.j["tip"] = new_base
        self._save()
        rr.enable(work)
        loaded = rr.import_resolutions(layout.resolutions, work)
        git("checkout", "-q", "-f", "--detach", new_base, cwd=work)
        self.log(f"bump: {len(commits)} patches from {old_pin.display} onto {new_pin.display}"
                 + (f" ({loaded} recorded resolutions loaded)" if loaded else ""))
        return self._run()

    def resume(self, drop: bool = False):
        self.j = jr.load(self.layout)
        if not self.j:
            raise RebaseError("no bump in progress (nothing to continue)")
        work = self.work
        phase = self.j["phase"]
        if drop and phase != "stopped":
            raise RebaseError("--drop applies only while the bump is stopped at a conflicting patch")
        if self.j["new_base"] is None:  # killed while importing the new base: start that step again
            new_base = import_base(work, self.layout.cache, _pin_from_toml(self.j["new_pin"]))
            self.j.update(new_base=new_base, tip=new_base)
            self._save()
            rr.enable(work)
            rr.import_resolutions(self.layout.resolutions, work)
            git("checkout", "-q", "-f", "--detach", new_base, cwd=work)
        if phase == "stopped":
            self._continue_stopped(drop)
        elif phase == "replaying":
            self._recover_replay()
        elif phase == "tests-failed":
            head = git("rev-parse", "HEAD", cwd=work).strip()
            if not is_clean(work):
                raise RebaseError(f"{work} has uncommitted changes; commit (amend the patch) first")
            if head != self.j["tip"]:
                if git("rev-list", "--count", f"{self.j['new_base']}..{head}", cwd=work).strip() != \
                        git("rev-list", "--count", f"{self.j['new_base']}..{self.j['tip']}", cwd=work).strip():
                    raise RebaseError("the work repo must keep one commit per patch while fixing tests")
                self.j["tip"] = head
            self.j["phase"] = "testing"
            self._save()
        return self._run()

    def abort(self):
        j = jr.load(self.layout)
        if not j:
            raise RebaseError("no bump in progress (nothing to abort)")
        jr.restore(self.layout, j)
        if j.get("materialized"):
            from tools.rebase.state import read_state

            version = read_state(self.layout).get("version")
            if version and (self.work / "megatron").is_dir():
                materialize(self.work, self.layout.package, version, force=True)
        jr.finish(self.layout)
        self.log(f"bump onto {j['onto']} aborted: pin, patches/, report and work repo restored")

    # -- replay
    def _recover_replay(self):
        """After a kill during replay: undo a half-done pick, or adopt a finished one."""
        work, j = self.work, self.j
        head = git("rev-parse", "HEAD", cwd=work).strip()
        if head != j["tip"]:
            parent = rev_parse(work, f"{head}^")
            idx = j["next"]
            if parent == j["tip"] and idx < len(j["commits"]) and _patch_name(work, head) == j["names"][idx]:
                self._record(idx, "clean", head)
            else:
                raise RebaseError(
                    f"{work} HEAD ({head[:12]}) is neither the bump's tip ({j['tip'][:12]}) nor one patch "
                    f"on top of it; run bump --abort"
                )
        _reset_to(work, j["tip"])

    def _record(self, idx, outcome, new_commit=None, upstream="", how="", note=""):
        j = self.j
        j["outcomes"].append({
            "index": idx, "name": j["names"][idx], "old": j["commits"][idx], "new": new_commit,
            "outcome": outcome, "upstream": upstream, "how": how, "note": note,
        })
        if new_commit:
            j["tip"] = new_commit
        j["next"] = idx + 1
        j["stopped"] = None
        j["phase"] = "replaying"
        self._save()

    def _upstream_candidates(self):
        j = self.j
        old_pin, new_pin = _pin_from_toml(j["old_pin"]), _pin_from_toml(j["new_pin"])
        if old_pin.kind != "git" or new_pin.kind != "git":
            return None
        if not hasattr(self, "_candidates"):
            paths = sorted({p for c in j["commits"] for p in _files_of(self.work, c)})
            self._candidates = upstream_commits(self.work, old_pin.commit, new_pin.commit, paths)
        return self._candidates

    def _absorbed_by(self, idx):
        """(upstream commit or "", how) if patch idx is already in the new base, else None."""
        work, j = self.work, self.j
        commit = j["commits"][idx]
        patch = list_range(work, f"{commit}^", commit)[0]
        candidates = self._upstream_candidates()
        if candidates:
            found, how = find_absorbing_commit(work, patch, candidates)
            if found and how == "same patch-id":
                return found, how
        if reverse_applies(work, j["tip"], patch.diff):
            found, how = find_absorbing_commit(work, patch, candidates or [])
            return found or "", "already applied: its reverse applies to the new tree" + (
                f"; carried by upstream {found[:12]} ({how})" if found else "")
        return None

    def _name_absorber(self, idx, why):
        candidates = self._upstream_candidates()
        if not candidates:
            return "", why
        commit = self.j["commits"][idx]
        patch = list_range(self.work, f"{commit}^", commit)[0]
        found, how = find_absorbing_commit(self.work, patch, candidates)
        return (found, f"{why}; {how}") if found else ("", why)

    def _run(self):
        j = self.j
        work = self.work
        while j["phase"] == "replaying" and j["next"] < len(j["commits"]):
            idx = j["next"]
            commit = j["commits"][idx]
            proc = git_proc(*rr.RERERE_CONFIG, "cherry-pick", "--no-commit", commit, cwd=work)
            self.hook("after-cherry-pick", index=idx)
            if proc.returncode == 0:
                if _staged_changes(work):
                    new = _commit_pick(work, commit)
                    self.hook("after-commit", index=idx)
                    self._record(idx, "clean", new)
                else:
                    _reset_to(work, j["tip"])
                    up, how = self._name_absorber(idx, "empty after replay")
                    self._record(idx, "absorbed", upstream=up, how=how)
                    self.log(f"  {j['names'][idx]}: absorbed upstream ({how})")
                continue
            unmerged = _unmerged(work)
            if not unmerged and not _marker_files(work):
                if _staged_changes(work):
                    new = _commit_pick(work, commit)
                    self._record(idx, "resolved-recorded", new, note="conflict resolved by a recorded resolution")
                    self.log(f"  {j['names'][idx]}: conflict resolved by a recorded resolution")
                else:
                    _reset_to(work, j["tip"])
                    up, how = self._name_absorber(idx, "empty after the recorded resolution")
                    self._record(idx, "absorbed", upstream=up, how=how)
                continue
            if "conflict" not in (proc.stdout + proc.stderr).lower() and not unmerged:
                _reset_to(work, j["tip"])
                raise RebaseError(f"replaying {j['names'][idx]} failed:\n{(proc.stdout + proc.stderr).strip()}")
            ids = rr.conflict_ids(work)
            absorbed = self._absorbed_by(idx)
            if absorbed:
                _reset_to(work, j["tip"])
                self._record(idx, "absorbed", upstream=absorbed[0], how=absorbed[1])
                self.log(f"  {j['names'][idx]}: absorbed upstream ({absorbed[1]})")
                continue
            j["phase"] = "stopped"
            j["stopped"] = {"index": idx, "files": unmerged, "rerere_ids": ids,
                            "upstream": self._upstream_touching(unmerged)}
            self._save()
            raise Stopped(self._conflict_summary())
        if j["phase"] == "replaying":
            j["phase"] = "testing"
            self._save()
        if j["phase"] == "testing":
            self._test_resolved()
        if j["phase"] == "finishing":
            return self._finish()
        return None

    def _upstream_touching(self, files):
        j = self.j
        old_pin, new_pin = _pin_from_toml(j["old_pin"]), _pin_from_toml(j["new_pin"])
        if old_pin.kind == "git" and new_pin.kind == "git":
            out = git("log", "--no-merges", "--format=%H %s", f"{old_pin.commit}..{new_pin.commit}", "--",
                      *files, cwd=self.work)
            return [{"commit": line[:40], "subject": line[41:]} for line in out.splitlines()]
        out = git("diff", "--numstat", j["old_base"], j["new_base"], "--", *files, cwd=self.work)
        return [{"file": parts[2], "added": parts[0], "removed": parts[1]}
                for parts in (line.split("\t", 2) for line in out.splitlines())]

    def _conflict_summary(self) -> str:
        j = self.j
        s = j["stopped"]
        idx = s["index"]
        new_pin = _pin_from_toml(j["new_pin"])
        lines = [
            f"bump stopped: patch {idx + 1:04d}-{j['names'][idx]} ({_subject(self.work, j['commits'][idx])}) "
            f"conflicts with {_base_label(new_pin)} in:",
            *[f"  {f}" for f in s["files"]],
        ]
        if s["upstream"] and "commit" in s["upstream"][0]:
            old_pin = _pin_from_toml(j["old_pin"])
            lines.append(f"upstream commits in {old_pin.commit[:12]}..{new_pin.commit[:12]} touching these files:")
            lines += [f"  {u['commit'][:12]} {u['subject']}" for u in s["upstream"]]
        elif s["upstream"]:
            lines.append("upstream changes to these files between the bases:")
            lines += [f"  {u['file']} (+{u['added']}/-{u['removed']})" for u in s["upstream"]]
        else:
            lines.append("(no upstream commit between the bases touches these files)")
        lines += [
            f"Resolve in {self.work} (edit the files, then `git -C {self.work} add <files>`; do not commit),",
            "then run `python -m tools.rebase bump --continue`. `bump --continue --drop` removes this",
            "patch on purpose; `bump --abort` restores the pin, patches/, report and work repo.",
        ]
        return "\n".join(lines)

    def _continue_stopped(self, drop: bool):
        j, work = self.j, self.work
        s = j["stopped"]
        idx = s["index"]
        name = j["names"][idx]
        if drop:
            _reset_to(work, j["tip"])
            self._record(idx, "dropped", note="removed on purpose by the maintainer")
            self.log(f"  {name}: dropped")
            return
        head = git("rev-parse", "HEAD", cwd=work).strip()
        if head != j["tip"]:
            if rev_parse(work, f"{head}^") == j["tip"] and _patch_name(work, head) == name and is_clean(work):
                rr.export_resolutions(work, self.layout.resolutions, name, s["rerere_ids"])
                self._record(idx, "resolved-manual", head, note="conflict resolved by hand")
                return
            raise RebaseError(f"{work} HEAD moved to {head[:12]}; expected {j['tip'][:12]} with the "
                              f"resolution of {name} staged (do not commit it yourself)")
        unmerged = _unmerged(work)
        if unmerged:
            raise RebaseError(f"{name}: still unmerged in {work}: {', '.join(unmerged)} "
                              f"(resolve, then `git -C {work} add` them)")
        markers = _marker_files(work)
        if markers:
            raise RebaseError(f"{name}: conflict markers left in {', '.join(markers)}")
        unstaged = git("diff", "--name-only", cwd=work).split()
        if unstaged:
            raise RebaseError(f"{name}: unstaged edits in {', '.join(unstaged)}; `git -C {work} add` them")
        rr.record(work)
        self.hook("after-record", index=idx)
        if _staged_changes(work):
            new = _commit_pick(work, j["commits"][idx])
            rr.export_resolutions(work, self.layout.resolutions, name, s["rerere_ids"])
            self._record(idx, "resolved-manual", new, note="conflict resolved by hand")
        else:
            _reset_to(work, j["tip"])
            up, how = self._name_absorber(idx, "empty after conflict resolution")
            self._record(idx, "absorbed", upstream=up, how=how)

    # -- tests and finish
    def _test_resolved(self):
        j = self.j
        todo = [o for o in j["outcomes"] if o["outcome"] in ("resolved-recorded", "resolved-manual")]
        if not self.run_tests or not todo:
            j["phase"] = "finishing"
            self._save()
            return
        work = self.work
        git("checkout", "-q", "-f", "--detach", j["tip"], cwd=work)
        if (work / "megatron").is_dir():
            j["materialized"] = True
            self._save()
            materialize(work, self.layout.package, "0+bump.testing", force=True)
        failures, results = [], {}
        tip_commits = git("rev-list", "--reverse", f"{j['new_base']}..{j['tip']}", cwd=work).split()
        by_name = {_patch_name(work, c): c for c in tip_commits}
        for o in todo:
            commit = by_name.get(o["name"])
            if not commit:
                continue
            ids = _tests_of(work, commit)
            outcome = self.test_runner(self.layout, o["name"], ids) if ids else {}
            results[o["name"]] = outcome
            failures += [f"{o['name']}: {node}: {res}" for node, res in sorted(outcome.items()) if res != "passed"]
        j["tests"] = results
        if failures:
            j["phase"] = "tests-failed"
            self._save()
            raise Stopped("bump stopped: tests of patches whose conflicts were resolved fail:\n  "
                          + "\n  ".join(failures)
                          + f"\nFix the patch in {work} (amend its commit), then `bump --continue`; "
                            "`bump --continue --no-tests` accepts as is; `bump --abort` restores everything.")
        j["phase"] = "finishing"
        self._save()

    def _finish(self):
        from tools.rebase.series import load_stack
        from tools.rebase.workrepo import export

        j, layout, work = self.j, self.layout, self.work
        new_pin = _pin_from_toml(j["new_pin"])
        old_pin = _pin_from_toml(j["old_pin"])
        layout.pin.write_text(j["new_pin"])
        self.hook("after-pin")
        git("checkout", "-q", "-f", "-B", "patched", j["tip"], cwd=work)
        export(layout, log=lambda *_: None)
        self.hook("after-export")
        _, patches = load_stack(layout)
        rr.prune(layout.resolutions, {p.name for p in patches})
        git("update-ref", LAST_OLD_REF, j["old_tip"], cwd=work)
        git("update-ref", LAST_NEW_REF, j["tip"], cwd=work)
        tests = {}
        tip_commits = git("rev-list", "--reverse", f"{j['new_base']}..{j['tip']}", cwd=work).split()
        by_name = {_patch_name(work, c): c for c in tip_commits}
        for name, outcome in j.get("tests", {}).items():
            if name in by_name and outcome:
                tests[by_name[name]] = outcome
        hints = {"absorbed": {}, "dropped": [], "notes": {}}
        for o in j["outcomes"]:
            if o["outcome"] == "absorbed":
                hints["absorbed"][o["old"]] = [o["upstream"], o["how"]]
            elif o["outcome"] == "dropped":
                hints["dropped"].append(o["old"])
            elif o["note"] and o["new"]:
                hints["notes"][o["new"]] = o["note"]
        record = {
            "old_pin": j["old_pin"], "new_pin": j["new_pin"],
            "old_base": j["old_base"], "old_tip": j["old_tip"],
            "new_base": j["new_base"], "new_tip": j["tip"],
            "hints": hints, "tests": tests,
        }
        last = jr.last_bump_dir(layout)
        last.mkdir(parents=True, exist_ok=True)
        (last / "record.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        data = report_from_record(work, record)
        write_report(data, layout.report_md, layout.report_json)
        self.hook("after-report")
        jr.finish(layout)
        counts = ", ".join(f"{n} {s}" for s, n in data["counts"].items() if n)
        self.log(f"bump done: {_base_label(old_pin)} -> {_base_label(new_pin)}; {counts}; "
                 f"wrote {layout.report_md.name} and {layout.report_json.name}")
        return data


def report_from_record(work: Path, record: dict, tests=None) -> dict:
    old_pin, new_pin = _pin_from_toml(record["old_pin"]), _pin_from_toml(record["new_pin"])
    upstream_range = (old_pin.commit, new_pin.commit) if old_pin.kind == new_pin.kind == "git" else None
    return build_report(work, record["old_base"], record["old_tip"], record["new_base"], record["new_tip"],
                        old_pin=old_pin, new_pin=new_pin, upstream_range=upstream_range,
                        hints=record.get("hints"), tests=tests if tests is not None else record.get("tests"))


def _patch_name(work: Path, commit: str) -> str:
    from tools.rebase.series import parse_trailers

    message = git("show", "-s", "--format=%B", commit, cwd=work)
    names = parse_trailers(message).get("Patch-Name", [])
    return names[0] if names else commit[:12]


def _subject(work: Path, commit: str) -> str:
    return git("show", "-s", "--format=%s", commit, cwd=work).strip()


def _tests_of(work: Path, commit: str) -> list:
    import re

    from tools.rebase.series import parse_trailers

    out = []
    for value in parse_trailers(git("show", "-s", "--format=%B", commit, cwd=work)).get("Tests", []):
        out.extend(v for v in re.split(r"[\s,]+", value) if v)
    return out


def _files_of(work: Path, commit: str) -> list:
    return git("diff-tree", "--no-commit-id", "--name-only", "-r", commit, cwd=work).split()


# ---------------------------------------------------------------- entry points

def bump(layout, spec: str, **kw):
    return Bump(layout, **kw).start(spec)


def bump_continue(layout, drop: bool = False, **kw):
    return Bump(layout, **kw).resume(drop=drop)


def bump_abort(layout, **kw):
    return Bump(layout, **kw).abort()
