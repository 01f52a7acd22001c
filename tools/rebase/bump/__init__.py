"""The bump state machine: replay onto a new upstream, the journal that survives a kill, recorded
resolutions, the dry-run forecast and the last-bump record."""
