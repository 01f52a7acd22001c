"""Tests of tools/rebase/analysis/."""
