"""``publish`` (a line as a branch of upstream's commit plus one commit per patch) and the
``check --published BRANCH`` verification; registered into ``cli.build_parser``."""

from tools.rebase.commands.helptext import add_command
from tools.rebase.errors import RebaseError


def register(sub, add_mirror, use_mirror):
    p = add_command(sub, "publish", help="write the line as a branch: upstream's commit + one commit per patch")
    p.add_argument("--branch", metavar="B", help="the branch to write (default: line/NAME, line/release for the "
                                                 "release line)")
    p.add_argument("--force", action="store_true", help="replace the branch when it holds something else")
    add_mirror(p)
    p.set_defaults(func=lambda args, lay: _cmd_publish(args, lay, use_mirror))


def _cmd_publish(args, lay, use_mirror):
    from tools.rebase.stack.publish import default_branch, publish
    from tools.rebase.stack.workrepo import apply

    use_mirror(args, lay)
    apply(lay, package=False)  # the tool's own apply path: every check of the pin and series applies
    publish(lay, args.branch or default_branch(lay), force=args.force)
    return 0


def published_problems(lay, branch: str) -> list:
    """``check --published BRANCH``: the branch must be exactly what ``publish`` writes for the
    series (built with apply's work repo, as publish does)."""
    from tools.rebase.stack.publish import verify_published
    from tools.rebase.stack.workrepo import apply

    if not branch:
        raise RebaseError("--published needs a branch name")
    apply(lay, package=False, log=lambda *_: None)
    return verify_published(lay, branch)
