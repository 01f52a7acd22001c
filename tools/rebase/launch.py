"""Entry point of the installed ``megatron-rebase`` command and of ``python -m tools.rebase``.

An installed copy of the tool (from ``pip install .``) can be older than the checkout a maintainer
is working in. When started inside a checkout that carries its own ``tools/rebase``, the launcher
hands over to that copy, so the command behaves the same from any directory of the checkout
(``.rebase/work``, ``tests/``, ...) whether or not the tool was installed.
"""

import os
import subprocess
import sys
from pathlib import Path

_HANDED_OVER = "MEGATRON_REBASE_IN_CHECKOUT"
_PIN_FILE = "upstream.toml"


def checkout_root(start: Path):
    """The nearest directory at or above ``start`` that holds the pin, patches/ and the tool."""
    for candidate in (start, *start.parents):
        if (candidate / _PIN_FILE).is_file() and (candidate / "tools" / "rebase" / "cli.py").is_file():
            return candidate
    return None


def own_root() -> Path:
    return Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    root = checkout_root(Path.cwd().resolve())
    if root is not None and root != own_root() and not os.environ.get(_HANDED_OVER):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
        env[_HANDED_OVER] = "1"
        return subprocess.call([sys.executable, "-m", "tools.rebase", *argv], env=env)
    from tools.rebase.cli import main as cli_main

    return cli_main(argv)
