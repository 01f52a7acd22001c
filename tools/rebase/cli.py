"""Thin command-line layer over the library; works from any directory of the checkout."""

import argparse
import signal
import sys
import time

from tools.rebase.commands.bump_cli import register as register_bump_and_report
from tools.rebase.commands.publish_cli import register as register_publish
from tools.rebase.errors import RebaseError
from tools.rebase.commands.helptext import add_command
from tools.rebase.git.paths import layout as find_layout


def _use_pin_mirror(args, lay) -> None:
    """``--mirror PATH``: read the pinned git base's objects from a local clone, for a line pinned
    to a repository this machine cannot reach (upstream ``main`` on a machine without GitHub). The
    pin still names its URL and commit; the commit must be in the clone."""
    if not getattr(args, "mirror", None):
        return
    from tools.rebase.stack.pin import load_pin
    from tools.rebase.stack.gitsource import use_mirror

    pin = load_pin(lay.pin)
    if pin.kind != "git":
        raise RebaseError(f"--mirror goes with a git pin; {lay.rel(lay.pin)} pins kind = \"{pin.kind}\"")
    use_mirror(pin.url, args.mirror)


def _add_mirror(p) -> None:
    p.add_argument("--mirror", metavar="PATH",
                   help="read the pinned git base's objects from this local repository (a line pinned "
                        "to a URL this machine cannot reach); the pin is unchanged")


def _cmd_apply(args, lay):
    from tools.rebase.stack.workrepo import apply

    _use_pin_mirror(args, lay)
    apply(lay, force=args.force, from_archive=args.from_archive)
    return 0


def _cmd_export(args, lay):
    from tools.rebase.stack.workrepo import export

    export(lay, replace_patches=args.replace_patches)
    return 0


def _cmd_edit(args, lay):
    from tools.rebase.stack.edit import edit

    edit(lay, args.patch, from_tree=args.from_tree, other_files=args.other_files)
    return 0


def _cmd_check(args, lay):
    from tools.rebase.proof.check import check, check_without_base
    from tools.rebase.git.lock import locked
    from tools.rebase.stack.workrepo import APPLY_LOCK_WAIT

    if args.no_base and args.mirror:
        raise RebaseError("--mirror and --no-base exclude each other (--no-base reads no base)")
    if args.no_base:  # reads the checkout only: no lock, no work repo
        problems = check_without_base(lay, strict_records=args.strict_records)
    else:
        _use_pin_mirror(args, lay)
        with locked(lay, "check", wait=APPLY_LOCK_WAIT):  # it imports the base and builds in the work repo
            problems = check(lay, strict_records=args.strict_records)
    if args.published:
        from tools.rebase.commands.publish_cli import published_problems

        problems = [*problems, *published_problems(lay, args.published)]
    if args.strict_records:  # the release check reads the report pair too (report/ sits above proof/)
        from tools.rebase.report.records import report_record_problems

        problems = [*problems, *report_record_problems(lay)]
    for problem in problems:
        print(f"check: {problem}", file=sys.stderr)
    if problems:
        print(f"check: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("check: ok")
    print(RECORDS_NOTE)
    return 0


# What a passing check says about patches/proof.json and REBASE_REPORT.*, which are data.
RECORDS_NOTE = ("check: a recorded proof or report that matches this stack (its digest) is a file a pull "
                "request can forge, digest included, so it proves nothing by itself: CI re-proves "
                "(python -m tools.rebase prove) to know")


def _cmd_tree(args, lay):
    from pathlib import Path

    from tools.rebase.git.lock import locked
    from tools.rebase.proof.variant import build_variant
    from tools.rebase.stack.workrepo import APPLY_LOCK_WAIT

    _use_pin_mirror(args, lay)
    with locked(lay, "tree", wait=APPLY_LOCK_WAIT):  # reads patches/ and the work repo's objects
        variant = build_variant(lay, Path(args.out), upto=args.upto, without=args.without or ())
    print(f"{Path(args.out) / 'megatron'}: the base and {len(variant.kept)} patch(es)"
          + (f"; left out: {', '.join(variant.left_out)}" if variant.left_out else "")
          + (f"; not applying without them, also left out: {', '.join(variant.not_applying)}"
             if variant.not_applying else ""))
    return 0


def _cmd_seed(args, lay):
    from tools.rebase.stack.seed import seed_line

    seed_line(lay)
    return 0


def _cmd_list(args, lay):
    from tools.rebase.proof.listing import patch_table, update_readme

    if args.update_readme:
        from tools.rebase.git.lock import locked

        with locked(lay, "list --update-readme"):
            print("README.md updated" if update_readme(lay) else "README.md already current")
    else:
        sys.stdout.write(patch_table(lay))
    return 0


def _prove_locked(args, lay):
    """``prove`` holds the checkout's lock for its whole run, as apply/export/bump/check do: it
    reads ``patches/`` and borrows the work repo's objects throughout, and ``--record`` writes a
    verdict for the stack it read, so neither may change under it (the record's digest check still
    catches a hand edit, which takes no lock)."""
    from tools.rebase.git.lock import locked
    from tools.rebase.stack.workrepo import APPLY_LOCK_WAIT

    command = "prove" + (" --mutants" if args.mutants is not None else "") + (" --record" if args.record else "")
    return locked(lay, command, wait=APPLY_LOCK_WAIT)


def _cmd_prove_mutants(args, lay):
    from tools.rebase.proof.prove_mutants import mutate, table, write_mutant_record
    from tools.rebase.proof.record import stack_digest_now

    if args.mutants < 1:
        raise RebaseError(f"--mutants needs a count >= 1, got {args.mutants}")
    if args.jobs < 1:
        raise RebaseError(f"--jobs needs a count >= 1, got {args.jobs}")
    with _prove_locked(args, lay):
        proved_digest = stack_digest_now(lay)
        previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        began = time.monotonic()
        try:
            scores = mutate(lay, args.patches, args.mutants, args.seed, jobs=args.jobs)
        finally:
            signal.signal(signal.SIGTERM, previous)
        sys.stdout.write(table(scores))
        print(f"mutants: {time.monotonic() - began:.0f} s wall with --jobs {args.jobs}; "
              f"{sum(s.seconds for s in scores):.0f} s of builds and test runs", file=sys.stderr)
        if args.record:
            print(f"wrote {write_mutant_record(lay, scores, args.mutants, args.seed, proved_digest)}")
    return 1 if any(s.survivors for s in scores) else 0


def _cmd_prove(args, lay):
    from tools.rebase.proof.prove import prove, table
    from tools.rebase.proof.record import FAILS_WITH, UNPROVEN, stack_digest_now, write_record

    _use_pin_mirror(args, lay)
    if args.mutants is not None:
        return _cmd_prove_mutants(args, lay)
    if args.record and args.patches:
        raise RebaseError("--record proves every patch of the series; leave out the patch names")
    if args.jobs < 1:
        raise RebaseError(f"--jobs needs a count >= 1, got {args.jobs}")
    with _prove_locked(args, lay):
        proved_digest = stack_digest_now(lay)
        # A terminated run still removes its scratch directories (and kills its pytest child).
        previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            proofs = prove(lay, args.patches, jobs=args.jobs)
        finally:
            signal.signal(signal.SIGTERM, previous)
        sys.stdout.write(table(proofs))
        if args.record:
            from tools.rebase.proof.listing import update_readme

            print(f"wrote {write_record(lay, proofs, proved_digest)}")
            print("README.md updated" if update_readme(lay) else "README.md already current")
    unproven = [p.name for p in proofs if p.verdict == UNPROVEN]
    failing = [p for p in proofs if p.verdict == FAILS_WITH]
    if unproven:
        print(f"prove: {len(unproven)} unproven patch(es): {', '.join(unproven)}", file=sys.stderr)
    if failing:
        print(f"prove: the Tests: of {len(failing)} patch(es) fail with the whole stack: "
              f"{', '.join(p.name for p in failing)}", file=sys.stderr)
        for p in failing:
            for note in p.with_notes:
                print(f"  {p.name}: {note}", file=sys.stderr)
    return 1 if unproven or failing else 0


def build_parser():
    from tools.rebase.commands.helptext import OVERVIEW

    parser = argparse.ArgumentParser(prog="python -m tools.rebase", description=__doc__, epilog=OVERVIEW,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-C", dest="directory", help="run as if started in this directory")
    sub = parser.add_subparsers(dest="command", required=True)
    p = add_command(sub, "apply", help="build the work repo (base + one commit per patch) and megatron/")
    p.add_argument("--force", action="store_true", help="discard unexported work-repo edits and local edits in megatron/")
    p.add_argument("--from-archive", action="store_true",
                   help="a git pin's commit that no mirror or cache holds: take upstream's archive of it, "
                        "checked against the pin's tree_sha256, instead of fetching its history")
    _add_mirror(p)
    p.set_defaults(func=_cmd_apply)
    p = add_command(sub, "export", help="regenerate patches/ from the work repo's commits")
    p.add_argument("--replace-patches", action="store_true",
                   help="overwrite patch files changed since the last apply/export (after rebuilding "
                        ".rebase/work from them by hand)")
    p.set_defaults(func=_cmd_export)
    p = add_command(sub, "edit", help="fold your uncommitted work-repo edits (or megatron/ hand edits) into PATCH and export")
    p.add_argument("patch", metavar="PATCH", help="Patch-Name, file name or number of the patch the change belongs to")
    p.add_argument("--from-tree", action="store_true",
                   help="take the hand edits made in the generated megatron/ instead of .rebase/work's")
    p.add_argument("--other-files", action="store_true",
                   help="fold the change in even where it touches files PATCH does not")
    p.set_defaults(func=_cmd_edit)
    p = add_command(sub, "check", help="verify pin, series, strict apply, export equality and Tests: trailers")
    p.add_argument("--no-base", action="store_true",
                   help="lint the series, patch files, trailers and resolutions only, without the upstream "
                        "base (CI that cannot fetch a line's pin); apply and export are not verified")
    p.add_argument("--strict-records", action="store_true",
                   help="fail when patches/proof.json (verdicts or mutant scores) is for another stack "
                        "(the maintainer's check at release or bump time); without it that is a STALE notice")
    p.add_argument("--published", metavar="BRANCH",
                   help="also verify BRANCH is the line as publish writes it (upstream's commit, then the patches)")
    _add_mirror(p)
    p.set_defaults(func=_cmd_check)
    p = add_command(sub, "list", help="print the patch table (Markdown)")
    p.add_argument("--update-readme", action="store_true", help="rewrite the table in README.md")
    p.set_defaults(func=_cmd_list)
    p = add_command(sub, "prove", help="require each patch's Tests: to fail on the stack without it")
    p.add_argument("patches", nargs="*", metavar="PATCH", help="Patch-Name, file name or number (default: all)")
    p.add_argument("--record", action="store_true",
                   help="write patches/proof.json (the README's verdict column); needs every patch")
    p.add_argument("--mutants", type=int, metavar="N",
                   help="instead: run N seeded mutants of each patch's added lines against its Tests: "
                        "and report killed/survived (slow: N+1 test runs per patch)")
    p.add_argument("--seed", type=int, default=0, help="seed of the mutant sample (default 0)")
    p.add_argument("--jobs", "-j", type=int, default=1, metavar="J",
                   help="run J patches (or mutants) at once, each in its own scratch copy; same "
                        "verdicts, printed in the same order, as --jobs 1 (default 1)")
    _add_mirror(p)
    p.set_defaults(func=_cmd_prove)
    p = add_command(sub, "tree", help="materialize a variant of the stack (its first patches, or without some) in a new directory")
    p.add_argument("out", metavar="DIR", help="a new or empty directory; DIR/megatron is written")
    p.add_argument("--upto", metavar="PATCH", help="the series up to and including this patch (default: all)")
    p.add_argument("--without", nargs="+", metavar="PATCH", help="leave these patches out")
    _add_mirror(p)
    p.set_defaults(func=_cmd_tree)
    p = add_command(sub, "seed", help="make a line's series, patches and pin the release line's (keeping its own)")
    p.set_defaults(func=_cmd_seed)
    register_bump_and_report(sub)  # they live in bump_cli.py
    register_publish(sub, _add_mirror, _use_pin_mirror)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        lay = find_layout(args.directory, args.line)
        return args.func(args, lay)
    except RebaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a missing, unreadable or dangling file: name it instead of a traceback
        print(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2
