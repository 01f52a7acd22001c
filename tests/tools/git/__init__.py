"""Tests of tools/rebase/git/."""
