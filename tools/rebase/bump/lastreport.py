"""The review report outside a bump: the last bump's (from its record, or rebuilt from the
history of a fresh clone) and a comparison of any two states of this checkout's ``patches/``,
each optionally with the new patches' ``Tests:`` run."""

import json
import tempfile
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.git.safefs import read_nofollow, write_file


class _Root:
    def __init__(self, root):
        self.root = Path(root)


def _tests_for(repo, base, tip, runner_root):
    """``{commit: {node id: outcome}}`` for the patches of ``base..tip`` that name Tests:."""
    from tools.rebase.bump.bump import pytest_runner
    from tools.rebase.analysis.diffparse import list_range

    results = {}
    for c in list_range(Path(repo), base, tip):
        if c.tests:
            results[c.commit] = pytest_runner(_Root(runner_root), c.name, c.tests)
    return results


def report_last_bump(lay, run_tests=False, log=None):
    """The last bump's report. Rebuilt in a fresh clone, its test results are the committed
    ``REBASE_REPORT.json``'s, which a pull request can write: ``log`` is told they were read back,
    not run (``run_tests`` runs them)."""
    from tools.rebase.bump.finish import report_from_record
    from tools.rebase.bump.journal import last_bump_dir

    path = last_bump_dir(lay) / "record.json"
    record = None
    if path.is_file() or path.is_symlink():  # a link there is refused by name, never read through
        try:
            record = json.loads(read_nofollow(path).decode("utf-8"))
        except ValueError as exc:
            raise RebaseError(f"{path} is corrupt ({exc}); delete it to rebuild the record from git history") from None
        record = _current_or_forgotten(lay, record, log)
    if record is None:  # a fresh clone: rebuild it from the commit that moved the pin and the committed report
        from tools.rebase.bump.lastbump import record_from_history

        record = record_from_history(lay, _stack_at)
        if record["tests"] and not run_tests and log is not None:
            log(_reused_tests_note(lay, record["tests"]))
    tests = None
    if run_tests:
        from tools.rebase.stack.state import read_state
        from tools.rebase.stack.workrepo import apply

        apply(lay, log=lambda *_: None)  # the tests run against megatron/ = the bumped stack
        if read_state(lay).get("tip") != record["new_tip"]:
            raise RebaseError("--run-tests: this checkout's stack is no longer the one the last bump made; "
                              "compare states with --old REV [--new REV] instead")
        tests = _tests_for(lay.work, record["new_base"], record["new_tip"], lay.root)
    return report_from_record(lay.work, record, tests=tests)


def _current_or_forgotten(lay, record: dict, log):
    """The record, or None once it is forgotten: a record whose new pin is not the checkout's
    describes a bump that was taken back (its printed undo puts the old pin and patches back),
    so it is removed and the report comes from the checkout's history instead."""
    import shutil

    from tools.rebase.bump.journal import last_bump_dir
    from tools.rebase.bump.prepare import _pin_from_toml
    from tools.rebase.stack.pin import load_pin

    try:
        current = _pin_from_toml(record["new_pin"]) == load_pin(lay.pin)
    except (KeyError, TypeError, ValueError, RebaseError) as exc:
        raise RebaseError(f"{last_bump_dir(lay) / 'record.json'} is corrupt ({exc}); delete it to rebuild "
                          f"the record from git history") from None
    if current:
        return record
    shutil.rmtree(last_bump_dir(lay))
    if log is not None:
        log(f"report: the last bump recorded on this machine (onto {_pin_from_toml(record['new_pin']).display}) "
            f"was undone (the pin is {load_pin(lay.pin).display} again): its record is removed; the report "
            f"is rebuilt from the checkout's history")
    return None


def _reused_tests_note(lay, tests: dict) -> str:
    shown = lay.rel(lay.report_json)
    count = sum(len(outcomes) for outcomes in tests.values())
    return (f"report: no bump ran on this machine: the {count} test result(s) of {len(tests)} patch(es) "
            f"are read back from the committed {shown}, not run here (a pull request can write any); "
            f"`report --run-tests` runs them")


def _stack_at(lay, rev):
    """Build the stack that ``patches/`` + the pin held at commit ``rev`` (None: working tree)."""
    from tools.rebase.git.gitcmd import git, rev_parse
    from tools.rebase.stack.pin import load_pin
    from tools.rebase.stack.series import load_stack
    from tools.rebase.git.paths import Layout
    from tools.rebase.stack.source import import_base
    from tools.rebase.stack.stack import build

    if rev is None:
        pin = load_pin(lay.pin)
        _, patches = load_stack(lay)
        paths = [p.path for p in patches]
        tmp = None
    else:
        commit = rev_parse(lay.root, rev)
        if commit is None:
            raise RebaseError(f"{rev!r} is not a commit of the checkout {lay.root}")
        rev = commit  # a commit id from here on: nothing user-typed reaches git again
        tmp = tempfile.TemporaryDirectory()
        root = Path(tmp.name)
        (root / "patches").mkdir()
        patches_at, pin_at = lay.rel(lay.patches), lay.rel(lay.pin)  # the line's own files
        names = git("ls-tree", "--name-only", f"{rev}:{patches_at}", cwd=lay.root).split()
        for name in names:
            if name == "series" or name.endswith(".patch"):
                data = git("show", f"{rev}:{patches_at}/{name}", cwd=lay.root, binary=True)
                write_file(root, root / "patches" / name, data)
        write_file(root, root / "upstream.toml", git("show", f"{rev}:{pin_at}", cwd=lay.root, binary=True))
        sub = Layout(root)
        pin = load_pin(sub.pin)
        _, patches = load_stack(sub)
        paths = [p.path for p in patches]
    try:
        base = import_base(lay.work, lay.cache, pin)
        commits = build(lay.work, base, paths, three_way=True)
    finally:
        if tmp is not None:
            tmp.cleanup()
    return pin, base, commits[-1] if commits else base


def report_between_states(lay, old_rev, new_rev, run_tests=False):
    from tools.rebase.report.report import build_report

    if not old_rev:
        raise RebaseError("--old REV is required when --new is given")
    old_pin, old_base, old_tip = _stack_at(lay, old_rev)
    new_pin, new_base, new_tip = _stack_at(lay, new_rev)
    upstream_range = (old_pin.commit, new_pin.commit) if old_pin.kind == new_pin.kind == "git" else None
    tests = None
    if run_tests:
        if new_rev is None:
            from tools.rebase.stack.workrepo import apply

            apply(lay, log=lambda *_: None)  # megatron/ = the working tree's stack
        # (with --new REV the tests run against this checkout's materialized megatron/)
        tests = _tests_for(lay.work, new_base, new_tip, lay.root)
    return build_report(lay.work, old_base, old_tip, new_base, new_tip, old_pin=old_pin, new_pin=new_pin,
                        upstream_range=upstream_range, tests=tests)
