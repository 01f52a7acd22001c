"""Tests of the patch-stack tooling in tools/.

Python started in tests/ (``cd tests; python -m tools.rebase ...``) finds this package first under
the bare name ``tools`` and would shadow the tool itself. Imported under that name, the package
points its search path at the checkout's real tools/ so that ``tools.rebase`` resolves to the tool.
"""

if __name__ == "tools":
    from pathlib import Path as _Path

    __path__[:] = [str(_Path(__file__).resolve().parents[2] / "tools")]
