"""``bump``: move the patch stack onto a new upstream base.

The patch commits are replayed with 3-way merges by ``git rebase`` (one run per stretch between
stops; rerere on, with the resolutions recorded in ``patches/resolutions/`` loaded first; committer
date = author date, so commit ids are the ones ``apply`` builds from the exported patches). Per
patch the outcome is one of:

- clean: replayed without conflict;
- resolved (recorded): rerere resolved every conflict; the patch's ``Tests:`` are re-run;
- resolved (by hand): the bump stopped, the maintainer resolved and ran ``bump --continue``;
- absorbed: the change is already in the new base (empty after replay or after resolution, its
  reverse applies to the new tree, or an upstream commit between the bases carries the same
  patch-id); the upstream commit is named when there is history to search;
- dropped: the maintainer removed it on purpose (``bump --continue --drop`` at its conflict).

Progress lives in the journal (``journal.py``) and in the work repo's own commits, so a bump can be
continued or aborted after being killed at any point, even inside ``git rebase``. On success the
pin is updated, ``patches/`` exported, and the report regenerated; ``apply`` then materializes
``megatron/``.
"""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tools.rebase import conflicts, dependents
from tools.rebase import journal as jr
from tools.rebase import resolutions as rr
from tools.rebase.basecompare import downgrade_warnings
from tools.rebase.classify import prefetch_range_diff
from tools.rebase.diffparse import find_absorbing_commit, list_range, prefetch_range, upstream_commits
from tools.rebase.errors import RebaseError
from tools.rebase.gitcmd import git, git_proc, head_commit, is_clean, rev_parse
from tools.rebase.gitlocks import clear_stale_locks
from tools.rebase.killpoints import env_hook
from tools.rebase.lint import first_broken, lint_change, lint_worktree
from tools.rebase.lock import locked
from tools.rebase.materialize import local_edits, materialize
from tools.rebase.testrun import COULD_NOT_RUN
from tools.rebase.pin import Pin, load_pin, parse_spec, pin_from_table
from tools.rebase.report import build_report, reverse_applies, write_report
from tools.rebase.safefs import write_file
from tools.rebase.source import download_sdist, import_base, resolve_git_ref, sha256_file
from tools.rebase.stack import chain_log, commit_message, prefetch_export

LAST_OLD_REF = "refs/rebase/last-bump/old"
LAST_NEW_REF = "refs/rebase/last-bump/new"


class Stopped(RebaseError):
    """The bump stopped and waits for the maintainer (conflict or failing tests)."""


def _resolve_hint(work):
    return [f"Resolve in {work} (edit the files, then `git -C {work} add <files>`; do not commit),",
            "then run `python -m tools.rebase bump --continue`. `bump --continue --drop` removes this",
            "patch on purpose; `bump --abort` restores the pin, patches/, report and work repo."]


# ---------------------------------------------------------------- tests

def pytest_runner(layout, name: str, node_ids: list) -> dict:
    """Run a patch's node ids in one pytest process (``megatron/`` is the bumped tree); see
    ``testrun.run_pytest`` for the outcomes (a broken environment is "could not run", not "failed")."""
    from tools.rebase.testrun import run_pytest

    from tools.rebase.testids import invalid_test_id

    # A Tests: id comes from a patch file (untrusted): one that could be read as a pytest option
    # or points outside tests/ is refused, never run.
    refused = {n: f"refused: {invalid_test_id(n)}" for n in node_ids if invalid_test_id(n)}
    results = run_pytest(layout.root, [n for n in node_ids if n not in refused])
    results.update(refused)
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


def _commit_pick(work: Path, original: str, date: str) -> str:
    """Commit the staged result as the replay of ``original`` (committer date = author date, so
    the id is the one ``apply`` builds from the exported patch)."""
    git("commit", "-q", "--no-verify", "--allow-empty-message", "-C", original, cwd=work,
        env={"GIT_COMMITTER_DATE": date})
    return git("rev-parse", "HEAD", cwd=work).strip()


def _describe(work: Path, base: str, tip: str):
    """``[(commit, Patch-Name or short id, raw author date)]`` of base..tip, in one git call."""
    from tools.rebase.series import parse_trailers

    rows = []
    for c in chain_log(work, base, tip):
        names = parse_trailers(c.message).get("Patch-Name", [])
        rows.append((c.commit, names[0] if names else c.commit[:12], c.author_date))
    return rows


def _recommit(work: Path, commit: str, parent: str, original: str, keep_message: bool,
              move_head: bool = True) -> str:
    """Rewrite ``commit`` onto ``parent`` with ``original``'s author (and message unless
    ``keep_message``), committer date = author date; move HEAD there (same tree: no checkout)."""
    fields = git("show", "-s", "--date=raw", "--format=%an%x00%ae%x00%ad", original, cwd=work).strip("\n")
    name, email, date = fields.split("\x00")
    message = commit_message(work, commit if keep_message else original).rstrip("\n") + "\n"
    tree = git("rev-parse", f"{commit}^{{tree}}", cwd=work).strip()
    env = {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_AUTHOR_DATE": date,
           "GIT_COMMITTER_DATE": date}
    new = git("commit-tree", tree, "-p", parent, "-F", "-", cwd=work, env=env, input=message).strip()
    if move_head:
        git("reset", "-q", "--soft", new, cwd=work)
    return new


def canonical_chain(work: Path, base: str, tip: str) -> str:
    """Make every commit of base..tip reproducible (tool committer, committer date = author date),
    rewriting from the first one that is not (e.g. amended by hand); return the new tip. Only
    objects are written: HEAD and branches stay (a bump may not touch them before its backup)."""
    from tools.rebase.gitcmd import COMMITTER_EMAIL, COMMITTER_NAME

    parent, dirty = base, False
    for c in chain_log(work, base, tip):
        dirty = dirty or (c.committer_name, c.committer_email, c.committer_date) != \
            (COMMITTER_NAME, COMMITTER_EMAIL, c.author_date)
        parent = _recommit(work, c.commit, parent, c.commit, keep_message=True, move_head=False) \
            if dirty else c.commit
    return parent


def _to_branch(work: Path, tip: str) -> None:
    """Put the work repo on branch ``patched`` at ``tip`` (HEAD is there already: no checkout)."""
    if _head(work) != tip:
        git("checkout", "-q", "-f", "--detach", tip, cwd=work)
    git("update-ref", "refs/heads/patched", tip, cwd=work)
    git("symbolic-ref", "HEAD", "refs/heads/patched", cwd=work)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def _head(work: Path) -> str:
    """HEAD's commit id, read without a git process when the files hold it plainly."""
    return head_commit(work) or git("rev-parse", "HEAD", cwd=work).strip()


def _reset_to(work: Path, commit: str) -> None:
    rr.forget_in_progress(work)  # first: `cherry-pick --quit` deletes MERGE_RR, which rerere clear reads
    for args in (("cherry-pick", "--quit"), ("merge", "--quit")):
        git_proc(*args, cwd=work)
    git("reset", "-q", "--hard", commit, cwd=work)
    git("clean", "-q", "-fd", cwd=work)


def _prefetch_finish(work: Path, j, tip: str) -> None:
    """Start the finish's read-only git work on ``new_base..tip`` (used if the bump ends there)."""
    prefetch_range(work, j.new_base, tip)
    prefetch_export(work, j.new_base, tip)
    prefetch_range_diff(work, j.old_base, j.old_tip, j.new_base, tip)


def _base_label(pin: Pin) -> str:
    return f"{pin.package} {pin.version}" if pin.kind == "pypi" else f"{pin.url}@{(pin.ref or pin.commit[:12])}"


def _refuse_package_edits(layout, why: str) -> None:
    edits = local_edits(layout.package)
    if edits:
        shown = ", ".join(edits[:10]) + (" ..." if len(edits) > 10 else "")
        raise RebaseError(f"{layout.package} has local edits ({shown}); {why}. Edits belong in the "
                          f"work repo ({layout.work}), exported to patches/.")


def _refuse_unsaved_work(layout) -> None:
    """Refuse before anything changes: hand edits in megatron/ (re-materialized for the tests and
    on abort) and *.patch files the series does not list (the bump's export would delete them)."""
    from tools.rebase.series import read_series

    _refuse_package_edits(layout, "a bump would overwrite them")
    listed = set(read_series(layout.series).names) if layout.series.is_file() else set()
    unlisted = sorted(p.name for p in layout.patches.glob("*.patch") if p.name not in listed)
    if unlisted:
        raise RebaseError(f"{layout.patches} holds patch files the series does not list: {', '.join(unlisted)}; "
                          f"the bump's export would delete them: add them to the series or move them away")


def _ensure_applied(layout) -> None:
    """Make the work repo hold exactly patches/ on the pin (cheap when it already does)."""
    from tools.rebase.series import load_stack
    from tools.rebase.state import current_digest, read_state
    from tools.rebase.workrepo import apply, guard_work_repo

    state = read_state(layout)
    if (layout.work / ".git").exists() and state.get("tip"):
        _, patches = load_stack(layout)
        if state.get("digest") == current_digest(layout, patches):
            guard_work_repo(layout, state)  # clean, and HEAD is the stack last applied/exported
            return
    apply(layout, log=lambda *_: None)


def _export(layout, base: str, tip: str) -> list:
    """Write patches/ (and the tool state) for base..tip; ``megatron/`` is left to ``apply``."""
    from tools.rebase.workrepo import write_patches

    return write_patches(layout, load_pin(layout.pin), base, tip)[1]


# ---------------------------------------------------------------- the bump

class Bump:
    def __init__(self, layout, log=print, test_runner=pytest_runner, hook=env_hook, run_tests=True):
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
        layout = self.layout
        existing = jr.load(layout)
        if existing:
            raise RebaseError(
                f"a bump onto {existing.onto} is already in progress ({existing.phase}); "
                f"run `python -m tools.rebase bump --continue` or `bump --abort` first"
            )
        _refuse_unsaved_work(layout)
        if (self.work / ".git").is_dir():
            clear_stale_locks(self.work)  # left by a git killed with an earlier run
        old_pin = load_pin(layout.pin)
        new_pin = resolve_spec(layout, spec)
        if new_pin == old_pin:
            raise RebaseError(f"the stack is already on {new_pin.display}; nothing to bump")
        _ensure_applied(layout)  # work repo == patches/ (refuses unexported work)
        work = self.work
        old_base = import_base(work, layout.cache, old_pin)
        # Hand-made commits (amended, am'd with a user identity) get reproducible twins, so the
        # report names the same old stack a fresh clone of patches/ would build; the maintainer's
        # branch itself stays where it was (abort must find it unchanged).
        old_head = _head(work)
        old_tip = canonical_chain(work, old_base, old_head)
        prefetch_range(work, old_base, old_tip)  # the report reads the old stack: start it now
        described = _describe(work, old_base, old_tip)
        commits = [c for c, _, _ in described]
        names = [n for _, n, _ in described]
        self.j = jr.begin(layout, jr.Journal(
            onto=spec, phase="replaying", old_pin=old_pin.to_toml(), new_pin=new_pin.to_toml(),
            old_base=old_base, old_tip=old_tip, old_head=old_head, commits=commits, names=names,
            dates=[d for _, _, d in described],
        ))
        self.hook("after-backup")
        loaded = self._import_new_base(new_pin)
        self.hook("after-import")
        for warning in downgrade_warnings(work, old_base, self.j.new_base, old_pin, new_pin):
            self.log(f"warning: {warning}")
        # HEAD stays on the old tip: the first `git rebase` then checks out the new base only once.
        self.log(f"bump: {len(commits)} patches from {old_pin.display} onto {new_pin.display}"
                 + (f" ({loaded} recorded resolutions loaded)" if loaded else ""))
        return self._run()

    def _import_new_base(self, new_pin) -> int:
        """Import the new base and load patches/resolutions/ into an rr-cache holding nothing else
        (the one from before the bump is in the backup), so only exported resolutions are reused."""
        new_base = import_base(self.work, self.layout.cache, new_pin)
        rr.reset_cache(self.work)
        loaded = rr.import_resolutions(self.layout.resolutions, self.work)
        self.j.new_base = new_base
        self.j.tip = new_base
        self._save()
        return loaded

    def resume(self, drop: bool = False):
        self.j = jr.load(self.layout)
        if not self.j:
            raise RebaseError("no bump in progress (nothing to continue)")
        work = self.work
        clear_stale_locks(work)
        phase = self.j.phase
        if drop and phase != "stopped":
            raise RebaseError("--drop applies only while the bump is stopped at a conflicting patch")
        if self.j.new_base is None:  # killed while importing the new base: start that step again
            self._import_new_base(_pin_from_toml(self.j.new_pin))
        if phase == "stopped":
            self._continue_stopped(drop)
        elif phase == "replaying":
            self._recover_replay()
        elif phase == "tests-failed":
            head = git("rev-parse", "HEAD", cwd=work).strip()
            if not is_clean(work):
                raise RebaseError(f"{work} has uncommitted changes; commit (amend the patch) first")
            if head != self.j.tip:
                if git("rev-list", "--count", f"{self.j.new_base}..{head}", cwd=work).strip() != \
                        git("rev-list", "--count", f"{self.j.new_base}..{self.j.tip}", cwd=work).strip():
                    raise RebaseError("the work repo must keep one commit per patch while fixing tests")
                self.j.tip = head
            self.j.phase = "testing"
            self._save()
        return self._run()

    def abort(self):
        layout = self.layout
        if not jr.in_progress(layout):
            raise RebaseError("no bump in progress (nothing to abort)")
        try:
            j = jr.load(layout)
        except jr.CorruptJournal as exc:  # the backup alone is enough to restore
            j = None
            self.log(f"warning: {exc}")
        jr.restore(layout)
        if j is None or j.materialized:
            self._rematerialize()
        jr.finish(layout)
        self.log(f"bump onto {j.onto if j else '(unknown: journal unreadable)'} aborted: "
                 f"pin, patches/, report and work repo restored")

    def _rematerialize(self):
        """Put back the megatron/ of the restored stack (the tests may have rewritten it); edits
        made by hand since then are kept (the bump refused to start over edits)."""
        from tools.rebase.state import read_state

        version = read_state(self.layout, tolerate_corrupt=True).get("version")
        if not version or not self.layout.package.is_dir() or not (self.work / "megatron").is_dir():
            return
        edits = local_edits(self.layout.package)
        if edits:
            self.log(f"warning: {self.layout.package} has edits made during the bump ({', '.join(edits[:5])}); "
                     f"left as is: `python -m tools.rebase apply --force` rebuilds it")
            return
        materialize(self.work, self.layout.package, version)

    # -- replay
    def _recover_replay(self):
        """After a kill during replay: adopt the patches git already committed, drop a half-done one."""
        work, j = self.work, self.j
        if (work / ".git" / "rebase-merge").is_dir():
            git_proc("rebase", "--quit", cwd=work)
        head = git("rev-parse", "HEAD", cwd=work).strip()
        if j.picking is not None:  # killed while committing a patch rerere had resolved
            idx = j.picking.index
            if head != j.tip and rev_parse(work, f"{head}^") == j.tip and _patch_name(work, head) == j.names[idx]:
                self._lint_recorded(idx, head)  # killed before its lint ran: a broken result still stops
                self._record_recorded(idx, head)
                _reset_to(work, head)
                return
            j.picking = None  # not committed: it is replayed (and resolved) again
            self._save()
        if head != j.tip and not (j.next == 0 and head in (j.old_tip, j.old_head)):
            if git_proc("merge-base", "--is-ancestor", j.tip, head, cwd=work).returncode != 0:
                raise RebaseError(f"{work} HEAD ({head[:12]}) does not descend from the bump's tip "
                                  f"({j.tip[:12]}); run bump --abort")
            self._adopt(head, end=None)
        _reset_to(work, j.tip)

    def _adopt(self, head, end):
        """Record the commits ``tip..head`` (made by one ``git rebase``) as replayed patches.

        Patches the rebase skipped between them became empty: absorbed. ``end`` is the index the
        rebase stopped at (or ``len(commits)`` when it finished), so the skipped patches before it
        are absorbed too; ``None`` when it was interrupted (what follows is not decided yet)."""
        j = self.j
        pos = j.next
        skipped = []
        for sha, name, k in self._match_replayed(head, end if end is not None else len(j.commits)):
            if k is None:
                raise RebaseError(f"{self.work}: commit {sha[:12]} ({name}) is not one of the patches "
                                  f"being replayed; run bump --abort")
            skipped += range(pos, k)
            self._note(k, "clean", sha)
            pos = k + 1
        if end is not None:
            skipped += range(pos, end)
            pos = end
        for k in skipped:
            self._note(k, "absorbed", upstream="", how="empty after replay")
        j.outcomes.sort(key=lambda o: o.index)
        j.next = pos
        self._save()
        for k in skipped:  # naming the absorbing commit needs the outcome list to be saved first
            up, how = self._name_absorber(k, "empty after replay")
            for o in j.outcomes:
                if o.index == k:
                    o.upstream, o.how = up, how
            self.log(f"  {j.names[k]}: absorbed upstream ({how})")
        if skipped:
            self._save()

    def _match_replayed(self, head, limit):
        """``[(commit, Patch-Name, patch index)]`` of tip..head: each commit matched by name to the
        next patch from ``j.next`` below ``limit`` (the ones between were skipped); a commit that
        matches none gets index None and ends the list."""
        j = self.j
        out, k = [], j.next
        for sha, name, _ in (_describe(self.work, j.tip, head) if head != j.tip else []):
            while k < limit and j.names[k] != name:
                k += 1
            out.append((sha, name, k if k < limit else None))
            if k == limit:
                break
            k += 1
        return out

    def _note(self, idx, outcome, new_commit=None, upstream="", how="", note=""):
        j = self.j
        j.outcomes.append(jr.Outcome(index=idx, name=j.names[idx], old=j.commits[idx], new=new_commit,
                                     outcome=outcome, upstream=upstream, how=how, note=note))
        if new_commit:
            j.tip = new_commit

    def _record(self, idx, outcome, new_commit=None, upstream="", how="", note=""):
        j = self.j
        self._note(idx, outcome, new_commit, upstream, how, note)
        j.next = idx + 1
        j.stopped = j.picking = None
        j.phase = "replaying"
        self._save()

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

    def _run(self):
        j = self.j
        work = self.work
        while j.phase == "replaying" and j.next < len(j.commits):
            # Replay everything left with one `git rebase` (3-way merges, rerere on, committer
            # date = author date so ids are reproducible); it stops at the first conflict.
            first = j.next
            upstream = j.commits[first - 1] if first else j.old_base
            proc = git_proc(*rr.RERERE_CONFIG, "rebase", "-q", "--onto", j.tip, "--reapply-cherry-picks",
                            "--empty=drop", "--committer-date-is-author-date", "--no-autosquash",
                            "--no-update-refs", upstream, j.old_tip, cwd=work)
            self.hook("after-rebase", index=first)
            idx = None
            if (work / ".git" / "rebase-merge").is_dir():
                stopped = _read(work / ".git" / "REBASE_HEAD")
                idx = next((k for k in range(first, len(j.commits))
                            if stopped and j.commits[k].startswith(stopped)), None)
                git_proc("rebase", "--quit", cwd=work)
                if idx is None:
                    _reset_to(work, _head(work))
                    raise RebaseError(f"git rebase stopped without naming the patch:\n"
                                      f"{(proc.stdout + proc.stderr).strip()}")
            elif proc.returncode != 0:
                _reset_to(work, j.tip)
                raise RebaseError(f"replaying the patches failed:\n{(proc.stdout + proc.stderr).strip()}")
            head, end = _head(work), idx if idx is not None else len(j.commits)
            if idx is None:  # replayed to the end: the export and report read head while lint runs
                _prefetch_finish(work, j, head)
            broken = self._lint_replayed(head, end)
            if broken:  # a clean merge that broke a Python file stops like a conflict
                k, bad, parent, findings = broken
                self._adopt(parent, end=k)
                self._stop_lint(k, bad, parent, findings)
            self._adopt(head, end=end)
            if idx is None:
                break
            commit = j.commits[idx]
            unmerged = _unmerged(work)
            if not unmerged and not _marker_files(work):
                # Nothing left to merge: rerere resolved every conflict from a recorded resolution
                # (or the result is empty: already in the new base).
                if _staged_changes(work):
                    ids = rr.conflict_ids(work)
                    j.picking = jr.StopInfo(index=idx, files=[], rerere_ids=ids, upstream=[])
                    self._save()  # a kill after the commit below must not pass it off as a clean replay
                    new = _commit_pick(work, commit, j.dates[idx])
                    self.hook("after-pick", index=idx)
                    self._lint_recorded(idx, new)
                    self._record_recorded(idx, new)
                    self.log(f"  {j.names[idx]}: conflict resolved by a recorded resolution")
                else:
                    _reset_to(work, j.tip)
                    up, how = self._name_absorber(idx, "empty after the recorded resolution")
                    self._record(idx, "absorbed", upstream=up, how=how)
                continue
            if not unmerged:
                _reset_to(work, j.tip)
                raise RebaseError(f"replaying {j.names[idx]} failed:\n{(proc.stdout + proc.stderr).strip()}")
            ids = rr.conflict_ids(work)
            absorbed = self._absorbed_by(idx)
            if absorbed:
                _reset_to(work, j.tip)
                self._record(idx, "absorbed", upstream=absorbed[0], how=absorbed[1])
                self.log(f"  {j.names[idx]}: absorbed upstream ({absorbed[1]})")
                continue
            rr.enable(work)  # so a commit the maintainer makes while resolving is recorded too
            touching = self._upstream_touching(unmerged)
            analysis = self._analyse_conflict(idx, proc.stdout + proc.stderr, touching)
            merged = sorted(set(git("diff", "--cached", "--name-only", cwd=work).split()) - set(unmerged))
            # files that merged cleanly next to the conflict can be broken too
            findings = lint_worktree(work, merged, baselines=(j.new_base, commit))
            j.phase = "stopped"
            j.stopped = jr.StopInfo(index=idx, files=unmerged, rerere_ids=ids, upstream=touching,
                                    kind="conflict", analysis=analysis,
                                    findings=[f.to_json() for f in findings])
            self._save()
            raise Stopped(self._conflict_summary())
        if j.phase == "replaying":
            j.phase = "testing"
            self._save()
        if j.phase == "testing":
            self._test_resolved()
        if j.phase == "finishing":
            return self._finish()
        return None

    def _upstream_touching(self, files):
        j = self.j
        old_pin, new_pin = _pin_from_toml(j.old_pin), _pin_from_toml(j.new_pin)
        if old_pin.kind == "git" and new_pin.kind == "git":
            out = git("log", "--no-merges", "--format=%H %s", f"{old_pin.commit}..{new_pin.commit}", "--",
                      *files, cwd=self.work)
            return [{"commit": line[:40], "subject": line[41:]} for line in out.splitlines()]
        out = git("diff", "--numstat", j.old_base, j.new_base, "--", *files, cwd=self.work)
        return [{"file": parts[2], "added": parts[0], "removed": parts[1]}
                for parts in (line.split("\t", 2) for line in out.splitlines())]

    # -- post-merge lint and conflict causes (tools/rebase/lint.py, conflicts.py)
    def _lint(self, idx, parent, commit):
        return lint_change(self.work, parent, commit, baselines=(self.j.new_base, self.j.commits[idx]))

    def _lint_replayed(self, head, end):
        """First patch of ``tip..head`` whose merge broke a Python file: (index, commit, parent,
        findings), or None."""
        j = self.j
        if head == j.tip:
            return None
        # a commit that is none of ours is left out here: _adopt reports it
        index = {sha: k for sha, _, k in self._match_replayed(head, end) if k is not None}
        broken = first_broken(self.work, j.tip, head,
                              lambda sha: (j.new_base, j.commits[index[sha]]) if sha in index else ())
        if broken and broken[0] in index:
            return index[broken[0]], broken[0], broken[1], broken[2]
        return None

    def _lint_recorded(self, idx, new):
        """A pick rerere resolved from a recorded resolution is linted like a clean merge."""
        findings = self._lint(idx, self.j.tip, new)
        if findings:
            self._stop_lint(idx, new, self.j.tip, findings)

    def _stop_lint(self, idx, bad, parent, findings):
        """Stop at patch ``idx`` with its merged result staged on ``parent`` for the maintainer."""
        _reset_to(self.work, bad)
        git("reset", "-q", "--soft", parent, cwd=self.work)
        files = sorted({f.path for f in findings})
        j = self.j
        j.phase = "stopped"
        j.picking = None
        j.stopped = jr.StopInfo(index=idx, files=files, rerere_ids=[], upstream=self._upstream_touching(files),
                                kind="lint", findings=[f.to_json() for f in findings])
        self._save()
        raise Stopped(self._conflict_summary())

    def _analyse_conflict(self, idx, output, touching):
        j = self.j
        old_pin, new_pin = _pin_from_toml(j.old_pin), _pin_from_toml(j.new_pin)
        # From an sdist (no history) each file starts at its closest upstream version.
        upstream_range = (old_pin.commit if old_pin.kind == "git" else None, new_pin.commit) \
            if new_pin.kind == "git" else None
        return conflicts.analyse(
            self.work, output, upstream_range=upstream_range,
            candidates=touching if old_pin.kind == new_pin.kind == "git" else [], new_base=j.new_base, tip=j.tip,
            old_chain=(j.old_base, j.commits[idx - 1] if idx else j.old_base))

    def _conflict_summary(self) -> str:
        j = self.j
        s = j.stopped
        idx = s.index
        new_pin = _pin_from_toml(j.new_pin)
        if s.kind == "lint":
            return "\n".join([
                f"bump stopped: patch {idx + 1:04d}-{j.names[idx]} merged without a conflict, but the "
                f"result breaks Python files (post-merge lint):",
                *[f"  {f['message']}" for f in s.findings],
                f"The merged result is staged in {self.work}: fix the files, `git -C {self.work} add` them "
                f"(do not commit), then run `python -m tools.rebase bump --continue`; `bump --continue "
                f"--drop` removes this patch on purpose; `bump --abort` restores everything."])
        if s.analysis:
            stack = {sha: f"{n}" for sha, n, _ in _describe(self.work, j.new_base, j.tip)} \
                if j.tip != j.new_base else {}
            dropped = {o.old: o.name for o in j.outcomes if o.outcome == "dropped"}
            return "\n".join([
                f"bump stopped: patch {idx + 1:04d}-{j.names[idx]} ({_subject(self.work, j.commits[idx])}) "
                f"conflicts with {_base_label(new_pin)} in:",
                *conflicts.summary_lines(s.analysis, stack, dropped),
                *(["upstream changes to these files between the bases:"]
                  + [f"  {u['file']} (+{u['added']}/-{u['removed']})" for u in s.upstream]
                  if s.upstream and "file" in s.upstream[0]
                  and not (s.analysis["causes"] or s.analysis["also"]) else []),
                *(["files that merged cleanly but break the post-merge lint:"]
                  + [f"  {f['message']}" for f in s.findings] if s.findings else []),
                *_resolve_hint(self.work)])
        lines = [
            f"bump stopped: patch {idx + 1:04d}-{j.names[idx]} ({_subject(self.work, j.commits[idx])}) "
            f"conflicts with {_base_label(new_pin)} in:",
            *[f"  {f}" for f in s.files],
        ]
        if s.upstream and "commit" in s.upstream[0]:
            old_pin = _pin_from_toml(j.old_pin)
            lines.append(f"upstream commits in {old_pin.commit[:12]}..{new_pin.commit[:12]} touching these files:")
            lines += [f"  {u['commit'][:12]} {u['subject']}" for u in s.upstream]
        elif s.upstream:
            lines.append("upstream changes to these files between the bases:")
            lines += [f"  {u['file']} (+{u['added']}/-{u['removed']})" for u in s.upstream]
        else:
            lines.append("(no upstream commit between the bases touches these files)")
        return "\n".join(lines + _resolve_hint(self.work))

    def _continue_stopped(self, drop: bool):
        j, work = self.j, self.work
        s = j.stopped
        idx = s.index
        name = j.names[idx]
        if drop:
            _reset_to(work, j.tip)
            note = self._drop_note(idx)
            self._record(idx, "dropped", note=note)
            self.log(f"  {name}: dropped ({note})")
            return
        head = git("rev-parse", "HEAD", cwd=work).strip()
        if head != j.tip:
            if rev_parse(work, f"{head}^") == j.tip and is_clean(work):
                # The maintainer committed the resolution: keep its tree (and its message when it
                # still names the patch), with the original author and a reproducible commit id.
                keep = _patch_name(work, head) == name
                self._lint_gate(idx, j.tip, head, undo=False)
                new = _recommit(work, head, j.tip, j.commits[idx], keep_message=keep)
                self._export_resolutions(name, s.rerere_ids)
                self._record(idx, "resolved-manual", new, note="conflict resolved by hand")
                return
            raise RebaseError(f"{work} HEAD moved to {head[:12]}; expected {j.tip[:12]} with the "
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
            new = _commit_pick(work, j.commits[idx], j.dates[idx])
            self.hook("after-pick", index=idx)
            self._lint_gate(idx, j.tip, new, undo=True)
            self._export_resolutions(name, s.rerere_ids)
            self._record(idx, "resolved-manual", new, note="conflict resolved by hand")
        else:
            _reset_to(work, j.tip)
            up, how = self._name_absorber(idx, "empty after conflict resolution")
            self._record(idx, "absorbed", upstream=up, how=how)

    def _record_recorded(self, idx: int, new: str) -> None:
        self._export_resolutions(self.j.names[idx], self.j.picking.rerere_ids)
        self._record(idx, "resolved-recorded", new, note="conflict resolved by a recorded resolution")

    def _export_resolutions(self, name: str, ids: list) -> None:
        """Store the resolutions rerere holds for ``ids`` under patches/resolutions/<name>/; say so
        when one could not be recorded (it will have to be resolved again on the next bump)."""
        missing = rr.export_resolutions(self.work, self.layout.resolutions, name, ids)
        if missing:
            self.log(f"  warning: {name}: rerere recorded no resolution for conflict(s) {', '.join(missing)}; "
                     f"the next bump will stop there again")

    def _drop_note(self, idx):
        """Which later patches rest on the dropped one's lines, and which tests it orphans."""
        j = self.j
        gone = {o.index for o in j.outcomes if o.outcome in ("dropped", "absorbed")}
        deps = dependents.context_dependents(self.work, j.old_base, j.commits, idx)
        tests = {n: _tests_of(self.work, c) for k, (c, n) in enumerate(zip(j.commits, j.names))
                 if k not in gone}
        return dependents.drop_note(j.names, deps, dependents.orphaned_tests(tests, j.names[idx]))

    def _lint_gate(self, idx, parent, commit, undo):
        """Refuse a resolution that breaks a Python file (``undo``: un-commit it, keep it staged)."""
        findings = self._lint(idx, parent, commit)
        if findings:
            if undo:
                git("reset", "-q", "--soft", parent, cwd=self.work)
            raise Stopped(f"{self.j.names[idx]}: the resolution breaks Python files (post-merge lint):\n"
                          + "\n".join(f"  {f}" for f in findings)
                          + "\nfix them and `git add` (do not commit), then `bump --continue` again")

    # -- tests and finish
    def _test_resolved(self):
        j = self.j
        todo = [o for o in j.outcomes if o.outcome in ("resolved-recorded", "resolved-manual")]
        if not self.run_tests or not todo:
            j.phase = "finishing"
            self._save()
            return
        work = self.work
        if not j.materialized:
            _refuse_package_edits(self.layout, "the tests of the resolved patches would overwrite them; "
                                  "move them away (or `bump --continue --no-tests`)")
        git("checkout", "-q", "-f", "--detach", j.tip, cwd=work)
        if (work / "megatron").is_dir():
            j.materialized = True
            self._save()
            materialize(work, self.layout.package, "0+bump.testing", force=True)
        failures, results = [], {}
        by_name = {n: c for c, n, _ in _describe(work, j.new_base, j.tip)}
        for o in todo:
            commit = by_name.get(o.name)
            if not commit:
                continue
            ids = _tests_of(work, commit)
            outcome = self.test_runner(self.layout, o.name, ids) if ids else {}
            results[o.name] = outcome
            failures += [f"{o.name}: {node}: {res}" for node, res in sorted(outcome.items()) if res != "passed"]
        j.tests = results
        if failures and all(COULD_NOT_RUN in f for f in failures):
            j.phase = "tests-failed"
            self._save()
            raise Stopped("bump stopped: the tests of patches whose conflicts were resolved could not run "
                          "(the environment, not the patch):\n  " + "\n  ".join(failures)
                          + "\nFix the environment and `bump --continue`, or `bump --continue --no-tests` to "
                            "accept the resolution unverified; `bump --abort` restores everything.")
        if failures:
            j.phase = "tests-failed"
            self._save()
            raise Stopped("bump stopped: tests of patches whose conflicts were resolved fail:\n  "
                          + "\n  ".join(failures)
                          + f"\nFix the patch in {work} (amend its commit), then `bump --continue`; "
                            "`bump --continue --no-tests` accepts as is; `bump --abort` restores everything.")
        j.phase = "finishing"
        self._save()
        self.hook("after-tests")

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
            rr.prune(layout.resolutions, {p.name for p in patches})
            from tools.rebase.listing import BEGIN, update_readme

            readme = layout.root / "README.md"
            if readme.is_file() and BEGIN in readme.read_text():
                update_readme(layout)  # the patch table names the base; keep check green
            git("update-ref", "--stdin", cwd=work,
                input=f"update {LAST_OLD_REF} {j.old_tip}\nupdate {LAST_NEW_REF} {j.tip}\n")
            last = jr.last_bump_dir(layout)
            write_file(layout.root, last / "record.json", json.dumps(record, indent=2, sort_keys=True) + "\n")
            data = report_job.result()
        write_report(data, layout.report_md, layout.report_json)
        self.hook("after-report")
        jr.finish(layout)
        counts = ", ".join(f"{n} {s}" for s, n in data["counts"].items() if n)
        self.log(f"bump done: {_base_label(old_pin)} -> {_base_label(new_pin)}; {counts}; "
                 f"wrote {layout.report_md.name} and {layout.report_json.name}; "
                 f"run `python -m tools.rebase apply` to materialize megatron/")
        return data


def report_from_record(work: Path, record: dict, tests=None) -> dict:
    old_pin, new_pin = _pin_from_toml(record["old_pin"]), _pin_from_toml(record["new_pin"])
    upstream_range = (old_pin.commit, new_pin.commit) if old_pin.kind == new_pin.kind == "git" else None
    return build_report(work, record["old_base"], record["old_tip"], record["new_base"], record["new_tip"],
                        old_pin=old_pin, new_pin=new_pin, upstream_range=upstream_range,
                        hints=record.get("hints"), tests=tests if tests is not None else record.get("tests"),
                        trusted=True)


def _patch_name(work: Path, commit: str) -> str:
    from tools.rebase.series import parse_trailers

    names = parse_trailers(commit_message(work, commit)).get("Patch-Name", [])
    return names[0] if names else commit[:12]


def _subject(work: Path, commit: str) -> str:
    return git("show", "-s", "--format=%s", commit, cwd=work).strip()


def _tests_of(work: Path, commit: str) -> list:
    from tools.rebase.series import parse_trailers, test_ids

    return test_ids(parse_trailers(commit_message(work, commit)))


def _files_of(work: Path, commit: str) -> list:
    return git("diff-tree", "--no-commit-id", "--name-only", "-r", commit, cwd=work).split()


# ---------------------------------------------------------------- entry points

def bump(layout, spec: str, **kw):
    with locked(layout, "bump"):
        return Bump(layout, **kw).start(spec)


def bump_continue(layout, drop: bool = False, **kw):
    with locked(layout, "bump --continue"):
        return Bump(layout, **kw).resume(drop=drop)


def bump_abort(layout, **kw):
    with locked(layout, "bump --abort"):
        return Bump(layout, **kw).abort()
