"""``bump`` and ``report`` subcommands (registered into ``cli.build_parser``)."""

import re
import sys
from pathlib import Path

from tools.rebase.bump.lastreport import _tests_for, report_between_states, report_last_bump
from tools.rebase.commands.helptext import add_command
from tools.rebase.errors import RebaseError
from tools.rebase.git.safefs import write_file

_RANGE = re.compile(r"^(?P<base>[^.\s][^\s]*?)\.\.(?P<tip>[^.\s][^\s]*)$")


def register(sub):
    p = add_command(sub, "bump", help="move the stack onto a new upstream (pypi:NAME==VER or git:URL@ref)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--onto", metavar="SPEC", help="pypi:megatron-core==X or git:URL-or-path@ref")
    g.add_argument("--continue", dest="cont", action="store_true", help="resume a stopped or interrupted bump")
    g.add_argument("--abort", action="store_true", help="restore pin, patches/, report and work repo")
    p.add_argument("--drop", action="store_true",
                   help="with --continue: remove the patch the bump stopped at, on purpose "
                        "(a line records it in patches/dropped)")
    p.add_argument("--take-from", metavar="LINE",
                   help="with --continue: resolve the stop with line LINE's version of the patch (the "
                        "stop names the lines whose version applies; `release` is the top-level line)")
    p.add_argument("--no-tests", action="store_true",
                   help="do not run the patches' Tests: on the bumped stack (kept for every --continue)")
    p.add_argument("--jobs", type=int, metavar="J",
                   help="run the finishing gate's tests in J pytest processes at once (kept for every "
                        "--continue; default 1)")
    p.add_argument("--mirror", metavar="PATH",
                   help="with --onto git:URL@ref: fetch URL's objects from this local repository; the pin "
                        "still records URL")
    p.add_argument("--dry-run", action="store_true",
                   help="with --onto: forecast the bump in a scratch copy (exit 1 if it would stop)")
    p.add_argument("--resolutions-from", metavar="LINE",
                   help="with --onto: also reuse the recorded resolutions of the line in lines/LINE/ "
                        "(a conflict it resolves is recorded in this line's own resolutions/)")
    p.add_argument("--allow-downgrade", action="store_true",
                   help="with --onto: move onto an older or lower-versioned base (e.g. a line onto an "
                        "older dev commit); refused without it, a dry run only warns")
    p.add_argument("--allow-broken-premise", action="store_true",
                   help="with --onto: bump even when the new base breaks the line's premise "
                        "(lines/NAME/premise.toml) or the reason of a recorded drop; refused without it")
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
    if args.take_from is not None and (not args.cont or args.drop):
        raise RebaseError("--take-from goes with --continue (and not with --drop)")
    if args.mirror:
        from tools.rebase.stack.pin import parse_spec
        from tools.rebase.stack.gitsource import use_mirror

        if not args.onto or parse_spec(args.onto)[0] != "git":
            raise RebaseError("--mirror goes with --onto git:URL@ref")
        use_mirror(parse_spec(args.onto)[1], args.mirror)
    if args.allow_downgrade and not args.onto:
        raise RebaseError("--allow-downgrade goes with --onto SPEC")
    if args.allow_broken_premise and not args.onto:
        raise RebaseError("--allow-broken-premise goes with --onto SPEC")
    if args.jobs is not None and (args.jobs < 1 or args.abort or args.dry_run):
        raise RebaseError("--jobs takes a count >= 1 and goes with --onto or --continue (not --dry-run)")
    if (args.output or args.json) and not args.dry_run:
        raise RebaseError("--output and --json go with --dry-run")
    lender = _resolutions_lender(args, lay)
    if args.dry_run:
        if not args.onto:
            raise RebaseError("--dry-run goes with --onto SPEC")
        from tools.rebase.bump import forecast

        data = forecast.forecast(lay, args.onto, resolutions_from=lender)
        forecast.write(data, args.output, args.json)
        if not args.output:
            sys.stdout.write(forecast.render(data))
        written = " and ".join(str(p) for p in (args.output, args.json) if p)
        # On the terminal whatever the outputs: a forecast written to files still says how it went.
        print(f"forecast: {forecast.outcome(data)}" + (f" (wrote {written})" if written else ""), file=sys.stderr)
        return 1 if data["would_stop"] else 0
    try:
        if args.abort:
            bump_abort(lay)
        elif args.cont:
            bump_continue(lay, drop=args.drop, take_from=args.take_from, run_tests=not args.no_tests,
                          jobs=args.jobs)
        else:
            bump(lay, args.onto, run_tests=not args.no_tests, resolutions_from=lender,
                 allow_downgrade=args.allow_downgrade, allow_broken_premise=args.allow_broken_premise,
                 jobs=args.jobs)
    except Stopped as exc:
        print(str(exc), file=sys.stderr)
        return 1
    return 0


def _resolutions_lender(args, lay):
    """The line ``--resolutions-from`` names (validated, a real folder of this checkout), or None."""
    if args.resolutions_from is None:
        return None
    if not args.onto:
        raise RebaseError("--resolutions-from goes with --onto SPEC (a bump in progress keeps the "
                          "resolutions it loaded when it started)")
    other = lay.for_line(args.resolutions_from)
    if other.line == lay.line:
        raise RebaseError(f"--resolutions-from {other.line}: that is the line being bumped; its own "
                          f"recorded resolutions are always reused")
    return other


def _split_range(value, flag):
    m = _RANGE.match(value or "")
    if not m:
        raise RebaseError(f"{flag} {value!r}: expected BASE..TIP (two revisions of the --repo repository)")
    for rev in (m["base"], m["tip"]):
        if rev.startswith("-"):
            raise RebaseError(f"{flag} {value!r}: revision {rev!r} starts with '-' (it would be read as a git option)")
    return m["base"], m["tip"]


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
                write_file(Path(args.json).parent, Path(args.json), dumps(data))
            sys.stdout.write(render_markdown(data))
            return 0
        write_report(data, Path(args.output), Path(args.json) if args.json else None)
        print(f"wrote {args.output}" + (f" and {args.json}" if args.json else ""))
        return 0
    md = Path(args.output) if args.output else lay.report_md
    js = Path(args.json) if args.json else (lay.report_json if not args.output else None)
    with locked(lay, "report"):
        data = report_last_bump(lay, run_tests=args.run_tests, log=print)
        write_report(data, md, js)
    print(f"wrote {md}" + (f" and {js}" if js else ""))
    return 0
