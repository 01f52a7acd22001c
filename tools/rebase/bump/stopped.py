"""The one exception a bump raises when it waits for the maintainer."""

from tools.rebase.errors import RebaseError


class Stopped(RebaseError):
    """The bump stopped and waits for the maintainer (conflict or failing tests)."""
