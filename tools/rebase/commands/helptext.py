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
    "check": (
        "What CI runs: pin checksum, series lint, strict apply with no fuzz, fresh export equal to "
        "the committed patches, every Tests: id exists, patches/proof.json (when present) recorded for this stack, README "
        "patch table current. Warns about "
        "work-repo commits that were never exported. With --no-base (a line whose upstream commit "
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
    "report": (
        "Regenerate the review report of the last bump, or compare two stacks (--repo with git "
        "ranges, or --old/--new commits of this checkout's patches/).",
        "REBASE_REPORT.md/.json for the last bump; ad-hoc comparisons go to --output/--json.",
        "a few seconds; --run-tests adds the patches' test time.",
    ),
}


def describe(command: str) -> str:
    """The ``description`` of ``command``'s parser: what it does, then Writes: and Takes:."""
    does, writes, takes = _COMMANDS[command]
    paragraphs = (does, f"Writes: {writes}", f"Takes: {takes}")
    return "\n\n".join(textwrap.fill(text, width=78, break_on_hyphens=False) for text in paragraphs)


def add_command(sub, name: str, help: str):
    """``sub.add_parser`` with the command's description, paragraphs kept as written."""
    parser = sub.add_parser(name, help=help, description=describe(name),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--line", metavar="NAME",
                        help="work on the line in lines/NAME/ (default: the release line at the top level)")
    return parser
