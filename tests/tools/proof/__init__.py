"""Tests of tools/rebase/proof/."""
