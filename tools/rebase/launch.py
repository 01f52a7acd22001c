"""Entry point of the installed ``megatron-rebase`` command and of ``python -m tools.rebase``.

An installed copy of the tool (from ``pip install .``) can be older than the checkout a maintainer
is working in. When started inside a checkout that carries its own ``tools/rebase``, the launcher
hands over to that copy, so the command behaves the same from any directory of the checkout
(``.rebase/work``, ``tests/``, ...) whether or not the tool was installed.

Handing over runs the checkout's code, so it happens only for a git checkout of this project (its
root commit is this project's, ``PROJECT_ROOT_COMMIT``), and the launcher says which copy runs. A
downloaded folder that merely holds ``upstream.toml`` and ``tools/rebase/cli.py`` is treated as
data: the installed copy runs on it.

A folder inside a ``.rebase/`` (the work repo ``.rebase/work``, which holds the upstream base's
tree, a bump's backup) is never a checkout: the search walks past it to the checkout around it,
and the handed-over run starts with ``python -P``, so the folder it was started in is not put
first on the path (``-m`` would import a ``tools/`` there). A copy of the tool that finds itself
loaded from inside a ``.rebase/`` (``python -m tools.rebase`` run in a work tree that holds one)
refuses to run.
"""

import os
import subprocess
import sys
from pathlib import Path

_HANDED_OVER = "MEGATRON_REBASE_IN_CHECKOUT"
_PIN_FILE = "upstream.toml"
_STATE_DIR = ".rebase"
# The first commit of this project's history; a checkout of the project (any branch, any fork of it)
# has it as its root commit.
PROJECT_ROOT_COMMIT = "1427901c8608f1c19152dc5d8f2f86e546845e97"


def checkout_root(start: Path):
    """The nearest directory at or above ``start`` that holds the pin, patches/ and the tool."""
    for candidate in (start, *start.parents):
        if _STATE_DIR in candidate.parts:
            continue  # the tool's own state (a work tree of the upstream base), never a checkout
        if (candidate / _PIN_FILE).is_file() and (candidate / "tools" / "rebase" / "cli.py").is_file():
            return candidate
    return None


def _editable_root():
    """The checkout an editable install maps ``megatron_rebase`` onto (this file is then
    ``<checkout>/tools/rebase/launch.py`` imported as ``megatron_rebase.launch``), else None."""
    here = Path(__file__).resolve()
    if __package__ != "tools.rebase" and here.parent.name == "rebase" and here.parent.parent.name == "tools":
        return here.parents[2]
    return None


def own_root() -> Path:
    """The folder this copy of the tool is imported from: the checkout (``tools/rebase/``, also
    under an editable install), or site-packages, where it is installed as ``megatron_rebase``."""
    return _editable_root() or Path(__file__).resolve().parents[len(__name__.split(".")) - 1]


def is_project_checkout(root: Path) -> bool:
    """A git checkout whose history starts at this project's root commit (hermetic git)."""
    if not (root / ".git").exists():
        return False
    from .git.gitcmd import git_proc  # relative: this file is also megatron_rebase.launch

    proc = git_proc("rev-list", "--max-parents=0", "HEAD", "--", cwd=root)
    return proc.returncode == 0 and PROJECT_ROOT_COMMIT in proc.stdout.split()


def loaded_from_state_dir() -> bool:
    """Whether this copy is a ``tools/rebase`` inside the ``.rebase/`` folder of a checkout (one
    that holds ``upstream.toml``): a work tree's (the upstream base's) copy, never the checkout's
    own tool."""
    if __package__ != "tools.rebase":
        return False
    root = own_root()
    return any(p.name == _STATE_DIR and (p.parent / _PIN_FILE).is_file() for p in (root, *root.parents))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _editable_checkout_on_path()  # before any module that imports ``tools.rebase`` is loaded
    if loaded_from_state_dir():
        print(f"megatron-rebase: refusing to run the copy of the tool at {own_root() / 'tools' / 'rebase'}: it "
              f"lies inside a {_STATE_DIR}/ folder (a work tree of the upstream base), not in a checkout. Run "
              f"`python -m tools.rebase` from the checkout's root, or the installed megatron-rebase",
              file=sys.stderr)
        return 2
    root = checkout_root(Path.cwd().resolve())
    if root is not None and root != own_root() and not os.environ.get(_HANDED_OVER):
        if not is_project_checkout(root):
            print(f"megatron-rebase: {root} is not a git checkout of this project (its root commit is not "
                  f"{PROJECT_ROOT_COMMIT[:12]}): its tools/ is not run; the installed tool at {own_root()} "
                  f"runs on it", file=sys.stderr)
        else:
            print(f"megatron-rebase: running the checkout's own tool, {root / 'tools' / 'rebase'} "
                  f"(the installed one at {own_root()} hands over)", file=sys.stderr)
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
            env[_HANDED_OVER] = "1"
            # -P: the folder it was started in (perhaps .rebase/work, holding upstream's tools/) is not on the path
            return subprocess.call([sys.executable, "-P", "-m", "tools.rebase", *argv], env=env)
    from .cli import main as cli_main

    return cli_main(argv)


def _editable_checkout_on_path() -> None:
    """An editable install maps ``megatron_rebase`` onto a checkout's ``tools/rebase``, whose modules
    import ``tools.rebase``: put that checkout on the path (a built wheel renames the imports, and
    its files are not inside a ``tools/rebase`` folder, so this does nothing there)."""
    root = _editable_root()
    if root is not None and (not sys.path or sys.path[0] != str(root)):
        sys.path.insert(0, str(root))  # first: a ``tools`` package elsewhere on the path never wins
