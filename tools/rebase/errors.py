"""The one exception type the tool raises for user-facing problems."""


class RebaseError(Exception):
    """A problem the user must fix; the message names what is wrong and where."""
