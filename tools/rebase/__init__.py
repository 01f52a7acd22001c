"""Patch-stack tooling: materialize, export, check, bump and report the fork's patch series.

The library lives in small modules (one job each) grouped in layer packages (``git``, ``stack``,
``proof``, ``analysis``, ``report``, ``bump``, ``commands``; see README.md); ``cli`` is a thin argument
layer on top.
"""

TOOL_VERSION = "1"
