"""Patch-stack tooling: materialize, export, check, bump and report the fork's patch series.

The library lives in small modules (one job each); ``cli`` is a thin argument layer on top.
"""

TOOL_VERSION = "1"
