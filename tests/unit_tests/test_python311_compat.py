"""Guards for patch ``py311-compat``: the fork must keep working on Python 3.11.

Upstream CI only runs 3.12, so every bump can bring back 3.12-only syntax or APIs; these tests
walk the whole materialized package with the running interpreter.
"""

import ast
import importlib
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import megatron

PACKAGE_ROOT = Path(megatron.__path__[0])
# Compiled helper that needs a C++ build step; optional upstream too.
ALLOWED_IMPORT_FAILURES = {"megatron.core.datasets.helpers"}


@pytest.mark.slow
def test_every_module_parses_with_running_interpreter():
    failures = []
    files = sorted(PACKAGE_ROOT.rglob("*.py"))
    assert len(files) > 400, f"expected the whole package under {PACKAGE_ROOT}, found {len(files)} files"
    for path in files:
        try:
            ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except SyntaxError as exc:
            failures.append(f"{path.relative_to(PACKAGE_ROOT.parent)}:{exc.lineno}: {exc.msg}")
    assert not failures, f"not valid Python {sys.version_info[:2]}:\n" + "\n".join(failures)


# Each failure is one tab-separated line behind a marker, so whatever a module prints while it is
# imported (several print a notice about an optional package) is not taken for a failure.
_MARK = "IMPORT-FAILED\t"
_IMPORT_ALL = r"""
import importlib, pkgutil, sys, megatron
for info in pkgutil.walk_packages(megatron.__path__, 'megatron.'):
    try:
        importlib.import_module(info.name)
    except BaseException as exc:
        missing = getattr(exc, 'name', None) if isinstance(exc, ModuleNotFoundError) else None
        # upstream's text_generation_server appends megatron/core to sys.path, so a third-party
        # package that is not installed (HF "datasets") can resolve to megatron/core/datasets and
        # fail as "cannot import name": the package is still what is missing.
        shadow = getattr(exc, 'path', None) or ''
        if missing is None and isinstance(exc, ImportError) and shadow.startswith(megatron.__path__[0]):
            name = getattr(exc, 'name', None) or ''
            if name and not name.startswith('megatron'):
                missing = name
        first = str(exc).splitlines()[0] if str(exc) else ''
        print("IMPORT-FAILED", info.name, type(exc).__name__, missing or '', first, sep='\t', flush=True)
"""


def _optional_third_party(missing):
    """A package outside the standard library and megatron that is not installed: the module
    needs an optional dependency (the whole upstream tree carries modelopt, pydantic, yaml users
    that megatron-core's package does not), which says nothing about the interpreter."""
    if not missing:
        return False
    top = missing.split(".", 1)[0]
    if top == "megatron" or top in sys.stdlib_module_names:
        return False
    return importlib.util.find_spec(top) is None


@pytest.mark.slow
def test_every_module_imports():
    # A fresh interpreter: module import side effects must not leak into other tests.
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL], capture_output=True, text=True, timeout=900,
        cwd=PACKAGE_ROOT.parent,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = [
        line[len(_MARK):].split("\t", 3) for line in proc.stdout.splitlines() if line.startswith(_MARK)
    ]
    unexpected = [
        f"{name}: {kind}: {message}"
        for name, kind, missing, message in failed
        if name not in ALLOWED_IMPORT_FAILURES and not _optional_third_party(missing)
    ]
    assert not unexpected, "modules that do not import on this interpreter:\n" + "\n".join(unexpected)
