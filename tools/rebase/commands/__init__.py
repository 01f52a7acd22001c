"""Argument registration and handlers of the subcommands that are more than a few lines, and the
help text of every subcommand."""
