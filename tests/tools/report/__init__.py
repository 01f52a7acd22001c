"""Tests of tools/rebase/report/."""
