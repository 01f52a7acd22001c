"""The review report: built from the analysis, rendered as Markdown and JSON."""
