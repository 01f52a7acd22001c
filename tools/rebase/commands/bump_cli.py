"""``bump`` and ``report`` subcommands (registered into ``cli.build_parser``)."""

import json
import re
import sys
import tempfile
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.commands.helptext import add_command

_RANGE = re.compile(r"^(?P<base>[^.\s][^\s]*?)\.\.(?P<tip>[^.\s][^\s]*)$")


def register(sub):
    p = add_command(sub, "bump", help="move the stack onto a new upstream (pypi:NAME==VER or git:URL@ref)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--onto", metavar="SPEC", help="pypi:megatron-core==X or git:URL-or-path@ref")
    g.add_argument("--continue", dest="cont", action="store_true", help="resume a stopped or interrupted bump")
    g.add_argument("--abort", action="store_true", help="restore pin, patches/, report and work repo")
    p.add_argument("--drop", action="store_true",
                   help="with --continue: remove the patch the bump stopped at, on purpose")
    p.add_argument("--no-tests", action="store_true",
                   help="do not re-run the Tests: of patches whose conflicts were resolved")
    p.add_argument("--mirror", metavar="PATH",
                   help="with --onto git:URL@ref: fetch URL's objects from this local repository; the pin "
                        "still records URL")
    p.add_argument("--dry-run", action="store_true",
                   help="with --onto: forecast the bump in a scratch copy (exit 1 if it would stop)")
    p.add_argument("--output", help="with --dry-run: write the forecast as Markdown here")
    p.add_argument("--json", help="with --dry-run: write the forecast as JSON here")
    p.set_defaults(func=_cmd_bump)

    p = add_command(sub, "report", help="regenerate REBASE_REPORT.md/.json (last bump, or any two stacks)")
    p.add_argument("--repo", help="compare two git ranges of this repository (a plain branch stack works)")
    p.add_argument("--old", help="BASE..TIP with --repo; else a commit of this checkout (its patches/ state)")
    p.add_argument("--new", help="BASE..TIP with --repo; else a commit of this checkout (default: working tree)")
    p.add_argument("--output", help="Markdown file (last bump: default REBASE_REPORT.md at the checkout root; "
                                    "comparisons: default stdout, never REBASE_REPORT.md)")
    p.add_argument("--json", help="JSON twin (default REBASE_REPORT.json next to the default Markdown)")
    p.add_argument("--run-tests", action="store_true",
                   help="run each new patch's Tests: (against this checkout's megatron/) and add a column")
    p.set_defaults(func=_cmd_report)


def _cmd_bump(args, lay):
    from tools.rebase.bump.bump import Stopped, bump, bump_abort, bump_continue

    if args.drop and not args.cont:
        raise RebaseError("--drop goes with --continue")
    if args.mirror:
        from tools.rebase.stack.pin import parse_spec
        from tools.rebase.stack.source import use_mirror

        if not args.onto or parse_spec(args.onto)[0] != "git":
            raise RebaseError("--mirror goes with --onto git:URL@ref")
        use_mirror(parse_spec(args.onto)[1], args.mirror)
    if (args.output or args.json) and not args.dry_run:
        raise RebaseError("--output and --json go with --dry-run")
    if args.dry_run:
        if not args.onto:
            raise RebaseError("--dry-run goes with --onto SPEC")
        from tools.rebase.bump import forecast

        data = forecast.forecast(lay, args.onto)
        forecast.write(data, args.output, args.json)
        if not args.output:
            sys.stdout.write(forecast.render(data))
        return 1 if data["would_stop"] else 0
    try:
        if args.abort:
            bump_abort(lay)
        elif args.cont:
            bump_continue(lay, drop=args.drop, run_tests=not args.no_tests)
        else:
            bump(lay, args.onto, run_tests=not args.no_tests)
    except Stopped as exc:
        print(str(exc), file=sys.stderr)
        return 1
    return 0


def _split_range(value, flag):
    m = _RANGE.match(value or "")
    if not m:
        raise RebaseError(f"{flag} {value!r}: expected BASE..TIP (two revisions of the --repo repository)")
    for rev in (m["base"], m["tip"]):
        if rev.startswith("-"):
            raise RebaseError(f"{flag} {value!r}: revision {rev!r} starts with '-' (it would be read as a git option)")
    return m["base"], m["tip"]


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


def _refuse_review_report(lay, *paths):
    """Only bump and a plain ``report`` write the committed review report."""
    for path in paths:
        if path and Path(path).resolve() in (lay.report_md.resolve(), lay.report_json.resolve()):
            raise RebaseError(f"{path} is the last bump's review report (written only by bump and a plain "
                              f"`report`); write this comparison to another --output/--json")


def _cmd_report(args, lay):
    from tools.rebase.git.lock import locked
    from tools.rebase.report.report import build_report, write_report

    if args.repo:
        _refuse_review_report(lay, args.output, args.json)
        if not args.old or not args.new:
            raise RebaseError("--repo needs --old BASE..TIP and --new BASE..TIP")
        if not args.output:
            raise RebaseError("--repo needs --output FILE.md (and optionally --json FILE.json)")
        repo = Path(args.repo).resolve()
        if not repo.is_dir():
            raise RebaseError(f"--repo {args.repo}: no such directory")
        ob, ot = _split_range(args.old, "--old")
        nb, nt = _split_range(args.new, "--new")
        data = build_report(repo, ob, ot, nb, nt)  # checks the ranges before any of their tests run
        if args.run_tests:
            tests = _tests_for(repo, data["new"]["base"]["commit"], data["new"]["tip"], repo)
            data = build_report(repo, ob, ot, nb, nt, tests=tests)
        write_report(data, Path(args.output), Path(args.json) if args.json else None)
        print(f"wrote {args.output}" + (f" and {args.json}" if args.json else ""))
        return 0
    if args.old or args.new:
        _refuse_review_report(lay, args.output, args.json)
        with locked(lay, "report"):  # it builds both stacks in the work repo
            data = report_between_states(lay, args.old, args.new, run_tests=args.run_tests)
        if not args.output:
            from tools.rebase.report.render import render_markdown
            from tools.rebase.report.report import dumps

            if args.json:
                Path(args.json).write_text(dumps(data))
            sys.stdout.write(render_markdown(data))
            return 0
        write_report(data, Path(args.output), Path(args.json) if args.json else None)
        print(f"wrote {args.output}" + (f" and {args.json}" if args.json else ""))
        return 0
    md = Path(args.output) if args.output else lay.report_md
    js = Path(args.json) if args.json else (lay.report_json if not args.output else None)
    with locked(lay, "report"):
        data = report_last_bump(lay, run_tests=args.run_tests)
        write_report(data, md, js)
    print(f"wrote {md}" + (f" and {js}" if js else ""))
    return 0


def report_last_bump(lay, run_tests=False):
    from tools.rebase.bump.finish import report_from_record
    from tools.rebase.bump.journal import last_bump_dir

    path = last_bump_dir(lay) / "record.json"
    if path.is_file():
        try:
            record = json.loads(path.read_text())
        except ValueError as exc:
            raise RebaseError(f"{path} is corrupt ({exc}); delete it to rebuild the record from git history") from None
    else:  # a fresh clone: rebuild it from the commit that moved the pin and the committed report
        from tools.rebase.bump.lastbump import record_from_history

        record = record_from_history(lay, _stack_at)
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
        names = git("ls-tree", "--name-only", f"{rev}:patches", cwd=lay.root).split()
        for name in names:
            if name == "series" or name.endswith(".patch"):
                data = git("show", f"{rev}:patches/{name}", cwd=lay.root, binary=True)
                (root / "patches" / name).write_bytes(data)
        (root / "upstream.toml").write_bytes(git("show", f"{rev}:upstream.toml", cwd=lay.root, binary=True))
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
