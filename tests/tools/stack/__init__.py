"""Tests of tools/rebase/stack/."""
