"""Tests of tools/rebase/bump/."""
