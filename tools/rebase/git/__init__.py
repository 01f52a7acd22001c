"""Plumbing every layer stands on: hermetic git, git lock files, the tool's own lock, names and
paths validated before use, background reads of immutable git queries."""
