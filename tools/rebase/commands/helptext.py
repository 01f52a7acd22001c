"""What each subcommand does, what it writes and how long it takes: the ``--help`` descriptions.

Kept in one table so that a new subcommand cannot ship without saying what it changes on disk.
"""

import argparse
import textwrap

_COMMANDS = {
    "apply": (
        "Import the pinned upstream base (download once, verify its sha256), build .rebase/work as "
        "the base plus one commit per patch, and materialize the patched megatron/ package. A no-op "
        "when nothing changed; refuses to drop unexported work-repo commits or hand edits in "
        "megatron/ unless --force.",
        "megatron/, .rebase/ (work repo, cache, state).",
        "about 30 s from scratch (plus the first download of about 2 MB); under a second when current.",
    ),
    "export": (
        "Regenerate patches/ (one NNNN-name.patch per work-repo commit, and series) from "
        ".rebase/work, hermetically, so an unchanged stack exports byte-identically.",
        "patches/ and .rebase/state.json.",
        "a few seconds.",
    ),
    "edit": (
        "Put a change into a patch below the top of the stack. Edit the files in .rebase/work "
        "(the whole stack applied; leave the change uncommitted), or with --from-tree the generated "
        "megatron/, then name the patch: the change is committed as a fixup! of that patch's "
        "commit, folded in by a non-interactive git rebase --autosquash, and exported. Refuses a "
        "change touching files the patch does not (unless --other-files); when a later patch no "
        "longer applies over it, everything is left as it was.",
        "the work repo's commits, patches/ (via export), .rebase/state.json, megatron/.",
        "a few seconds.",
    ),
    "check": (
        "What CI runs: pin checksum, series lint, strict apply with no fuzz, fresh export equal to "
        "the committed patches, every Tests: id exists, patches/proof.json (when present) well-formed, README "
        "patch table current. Warns about "
        "work-repo commits that were never exported. A proof record or mutant scores made on another "
        "stack (any patch edit) are reported as STALE, not as a failure: CI re-proves the stack with "
        "prove, and the maintainer refreshes the record at release or bump time (prove --record; "
        "prove --mutants N --record NAMES), where --strict-records makes staleness fail. With --no-base (a line whose upstream commit "
        "CI cannot fetch) only the lints run, and the output says apply and export were not verified.",
        "nothing in the checkout's tracked files; it (re)builds commits in .rebase/work's object store.",
        "about 30 s from scratch; a few seconds when the base is cached.",
    ),
    "prove": (
        "Prove every patch is needed: rebuild the stack without it in a scratch repo (later patches "
        "that then fail to apply or to import are dropped too and named), run its Tests: there and "
        "require at least one to fail. Exits 1 on any unproven patch.",
        "nothing in the checkout; with --record, patches/proof.json and the README's Proof column.",
        "15 s to about a minute per patch on 2 cores; "
        "the whole stack, the sum over its patches.",
    ),
    "tree": (
        "Materialize a variant of the stack in a new or empty directory: the base plus the series "
        "up to --upto, minus the --without patches (later patches that then fail to apply are left "
        "out too and named), built as prove builds its trees. For measuring what patches do, e.g. "
        "as a benchmark's --upstream or --fork-root.",
        "DIR/megatron only; nothing in the checkout.",
        "about as long as apply from scratch (a few seconds when the base is cached).",
    ),
    "list": (
        "Print the patch table (Markdown) that the README carries.",
        "nothing, or README.md with --update-readme.",
        "under a second.",
    ),
    "bump": (
        "Move the stack onto a new upstream: replay every patch with 3-way merges and recorded "
        "resolutions, drop absorbed patches, then update the pin, export patches/ and write the "
        "range-diff review report. Stops on a conflict (with its upstream causes) or a post-merge "
        "lint finding for you to resolve, then --continue (or --drop the patch: on a line the drop "
        "is recorded in lines/NAME/patches/dropped, and the line's next bump drops it again); "
        "--abort restores everything exactly. "
        "--dry-run forecasts every stop by running the bump in a scratch copy.",
        "upstream.toml, patches/ (and patches/resolutions/), REBASE_REPORT.md/.json, the README's "
        "patch table, .rebase/, and megatron/ while re-running Tests: of resolved patches (put back "
        "as it was when the bump ends; `apply` materializes the new stack); "
        "with --dry-run only --output/--json (and the download cache).",
        "tens of seconds for an sdist bump; a git bump also imports upstream history (longer the "
        "first time); re-running Tests: of resolved patches adds their test time; a --dry-run onto "
        "a far upstream, a few minutes.",
    ),
    "seed": (
        "Refresh a line's starting point from the release line (needs --line NAME): its series, "
        "patch files and pin become the release line's, keeping the line's resolutions/, proof "
        "record, report, recorded drops (patches/dropped), the Tests: ids only the line's patches "
        "name and the whole message of a patch whose Upstream-Status the line changed; then run `bump --line "
        "NAME --onto <its base>`. Refuses when the line holds patches the release line lacks, a "
        "bump is in progress on it, or it has unexported work.",
        "lines/NAME/upstream.toml, lines/NAME/patches/series and *.patch; the replaced files are "
        "saved in .rebase/lines/NAME/seed-backup/.",
        "under a second.",
    ),
    "publish": (
        "Write the line as a branch of this repository: its first parent is the pinned upstream "
        "commit (the release line: the commit of the pinned sdist's tree that apply imports), then "
        "one commit per patch in series order, each with the patch's message, trailers, author and "
        "date. Its tree installs with upstream's own packaging (pip install git+URL@BRANCH). The "
        "same stack always gives the same commit ids; check --published BRANCH verifies a branch. "
        "Nothing is pushed.",
        "the branch (default line/NAME) in the checkout's repository, with the upstream history its "
        "commits need; .rebase/ as apply writes it (megatron/ is left as it is).",
        "as long as apply (a few seconds when the base is cached), plus copying upstream's history "
        "into the repository the first time.",
    ),
    "report": (
        "Regenerate the review report of the last bump, or compare two stacks (--repo with git "
        "ranges, or --old/--new commits of this checkout's patches/).",
        "REBASE_REPORT.md/.json for the last bump; ad-hoc comparisons go to --output/--json.",
        "a few seconds; --run-tests adds the patches' test time.",
    ),
}


# Command lines a maintainer types, each with what it does: the Examples: of ``--help``, as in a
# man page. Every subcommand has at least one (tests/tools/test_cli_help_and_check_warning.py).
_EXAMPLES = {
    "apply": [("apply", "build .rebase/work and megatron/ from upstream.toml + patches/"),
              ("apply --line upstream-main", "the same for the line in lines/upstream-main/"),
              ("apply --force", "rebuild, discarding unexported work-repo commits and megatron/ edits")],
    "export": [("export", "write patches/ from .rebase/work's commits (after committing there)")],
    "edit": [("edit 0008", "fold .rebase/work's uncommitted change into patch 0008, then export"),
             ("edit mtp-detach-output-layer --from-tree", "fold the hand edits made in megatron/ into that patch"),
             ("edit 0008 --other-files", "fold it in even where it touches files 0008 does not")],
    "check": [("check", "what CI runs; records for another stack are STALE notices, exit 0"),
              ("check --strict-records", "the maintainer's release/bump check: a stale record fails"),
              ("check --no-base --line upstream-main", "lints only, for a line whose base CI cannot fetch")],
    "prove": [("prove 0008 mtp-loss-mask-contract", "prove two patches (a few minutes)"),
              ("prove --record --jobs 2", "prove all and refresh patches/proof.json and the README column"),
              ("prove --mutants 8 --record NAMES", "re-score the mutant records check lists as STALE")],
    "tree": [("tree /tmp/without-0017 --without 0017", "the stack without one patch, for a benchmark")],
    "list": [("list", "print the patch table"),
             ("list --update-readme", "rewrite the README's table (after adding or renaming a patch)")],
    "bump": [("bump --onto pypi:megatron-core==0.19.3 --dry-run", "forecast a bump; prints the outcome line"),
             ("bump --onto pypi:megatron-core==0.19.3", "bump; stops at a conflict for --continue"),
             ("bump --continue", "after resolving the stop in .rebase/work (git add)"),
             ("bump --abort", "restore everything as it was before the bump"),
             ("bump --line upstream-dev --onto git:URL@COMMIT --allow-downgrade",
              "move a line onto an older-dated base (refused without the flag)")],
    "publish": [("publish --line upstream-dev --mirror PATH", "write branch line/upstream-dev from a local clone"),
                ("check --line upstream-dev --published line/upstream-dev", "verify a published branch")],
    "seed": [("seed --line upstream-main", "restart the line from the release line's patches")],
    "report": [("report", "regenerate REBASE_REPORT.md/.json of the last bump"),
               ("report --old HEAD~5 --output /tmp/r.md", "compare the stack of an earlier commit")],
}
SEE_ALSO = "docs/editing-a-patch.md (changing patches, the record rule, bumps);\n  tools/rebase/README.md (the code)"
# The top-level ``--help`` epilog: the everyday flow, and the rule for the proof records.
OVERVIEW = """A contributor's edit, in seconds:
  python -m tools.rebase apply         # .rebase/work and megatron/ from patches/
  (edit files in .rebase/work; or in megatron/, then add --from-tree below)
  python -m tools.rebase edit PATCH    # fold the change into PATCH and export
  python -m tools.rebase check         # a proof record for another stack is STALE, not a failure

The maintainer refreshes the records at release or bump time (prove --record;
prove --mutants N --record NAMES; check --strict-records). `COMMAND --help` shows
what each command writes, how long it takes, and examples.

See also: """ + SEE_ALSO


def describe(command: str) -> str:
    """The ``description`` of ``command``'s parser, laid out as a man page: what it does, then
    Writes:, Takes:, Examples: and See also:."""
    does, writes, takes = _COMMANDS[command]
    paragraphs = (does, f"Writes: {writes}", f"Takes: {takes}")
    text = "\n\n".join(textwrap.fill(t, width=78, break_on_hyphens=False) for t in paragraphs)
    examples = "\n".join(f"  python -m tools.rebase {line}\n      {what}" for line, what in _EXAMPLES[command])
    return f"{text}\n\nExamples:\n{examples}\n\nSee also: {SEE_ALSO}"


def add_command(sub, name: str, help: str):
    """``sub.add_parser`` with the command's description, paragraphs kept as written."""
    parser = sub.add_parser(name, help=help, description=describe(name),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--line", metavar="NAME",
                        help="work on the line in lines/NAME/ (default: the release line at the top level)")
    return parser
