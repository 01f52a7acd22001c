"""Interpreters that import the tree under test, never a fork installed in the environment.

``prove`` runs a patch's tests against a scratch stack. In a venv where the fork is also
installed (``pip install -e .``, the development setup), the install's import hook (setuptools'
editable finder sits on ``sys.meta_path``, ahead of every ``sys.path`` entry) would hand the
tests the installed ``megatron`` instead, and the verdict would depend on the environment.

:func:`isolated_env` gives a child interpreter an environment without inherited import paths
(``PYTHONPATH``, user site, startup files) whose ``PYTHONPATH`` is the tree followed by a
directory holding the ``sitecustomize`` below. Python imports it after the site ``.pth`` files
have run, so it can undo what they did: it wraps every import hook so that none resolves a module
of the tree's top-level packages (at any depth: an editable install maps ``megatron.core``, so a
module the tree lacks would be found in the installed checkout) outside the tree, forgets such
modules if a ``.pth`` already imported them,
and puts the tree first on ``sys.path``; then it runs the ``sitecustomize`` it shadows, if any.
Children of the child (spawned ranks, ``subprocess`` tests) inherit the environment, so they are
isolated the same way.
"""

import os
from pathlib import Path

from tools.rebase.git.safefs import write_file

ROOT_VARIABLE = "FORK_ISOLATED_ROOT"

# Variables that add import paths or run code at start-up; none may leak into a proof.
_INHERITED = ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONSAFEPATH", "PYTHONHOME",
              "PYTHONPLATLIBDIR", "PYTHONEXECUTABLE")

_SITECUSTOMIZE = '''\
"""Written by tools/rebase/proof/isolation.py: import the tree in $FORK_ISOLATED_ROOT, nothing else."""
import importlib.machinery
import importlib.util
import os
import sys


def _isolate(root):
    names = [n for n in os.listdir(root) if n.isidentifier() and os.path.isdir(os.path.join(root, n))]

    def inside(path):
        path = os.path.realpath(path)
        return path == root or path.startswith(root + os.sep)

    def elsewhere(spec):
        if spec is None:
            return False
        places = list(spec.submodule_search_locations or []) + [spec.origin or ""]
        return any(p and os.path.isabs(p) and not inside(p) for p in places)

    standard = (importlib.machinery.BuiltinImporter, importlib.machinery.FrozenImporter,
                importlib.machinery.PathFinder)

    class _TreeOnly:
        """Wraps an import hook: for the tree's packages and every module under them, the hook's
        answer is taken only when it lies inside the tree (an editable install maps
        ``megatron.core`` and its submodules, not ``megatron``: a module the tree lacks would
        otherwise be found in the installed checkout)."""

        def __init__(self, hook):
            self.hook = hook

        def find_spec(self, fullname, path=None, target=None):
            try:
                spec = self.hook.find_spec(fullname, path, target)
            except TypeError:  # a hook written without the optional target argument
                spec = self.hook.find_spec(fullname, path)
            if fullname.split(".")[0] in names and elsewhere(spec):
                return None
            return spec

        def __getattr__(self, attr):
            return getattr(self.hook, attr)

    sys.meta_path[:] = [f if f in standard or not hasattr(f, "find_spec") else _TreeOnly(f)
                        for f in sys.meta_path]
    for name in list(sys.modules):
        if name.split(".")[0] in names:
            module = sys.modules[name]
            where = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", [])), None)
            if where and not inside(where):
                del sys.modules[name]
    sys.path[:] = [root] + [p for p in sys.path if os.path.realpath(p or os.curdir) != root]


def _run_shadowed():
    here = os.path.dirname(os.path.realpath(__file__))
    for entry in sys.path:
        candidate = os.path.join(entry or os.curdir, "sitecustomize.py")
        if os.path.realpath(os.path.dirname(candidate)) != here and os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_root = os.environ.get("''' + ROOT_VARIABLE + '''")
if _root and os.path.isdir(_root):
    _isolate(os.path.realpath(_root))
_run_shadowed()
'''


def write_shim(directory: Path) -> Path:
    """Write the ``sitecustomize`` into ``directory`` (made if missing); return it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_file(directory, directory / "sitecustomize.py", _SITECUSTOMIZE)
    return directory


def isolated_env(root: Path, shim_dir: Path, **extra) -> dict:
    """The environment for an interpreter that must import ``root``'s packages only; the
    ``sitecustomize`` is written to ``shim_dir`` (keep it outside a checkout)."""
    root = Path(root).resolve()
    shim = write_shim(shim_dir).resolve()
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED}
    env.update(PYTHONPATH=os.pathsep.join([str(root), str(shim)]), PYTHONNOUSERSITE="1",
               PYTHONDONTWRITEBYTECODE="1", **{ROOT_VARIABLE: str(root)})
    env.update(extra)
    return env
