"""Build the fork as the ``megatron-core`` distribution.

The package is not committed: building first materializes it (pinned upstream + ``patches/``)
with ``python -m tools.rebase apply``, which is a fast no-op when ``megatron/`` is current. The
version is upstream's plus a PEP 440 local label naming the stack (e.g. ``0.19.2+rl.20.243f0da1``),
so anything that depends on ``megatron-core`` resolves to the fork.

``MEGATRON_FORK_SKIP_APPLY=1`` skips the apply when ``megatron/`` exists (a read-only checkout that
is already materialized, or a build that prepared it itself); the package is then that folder as
it is. This file is code of the checkout (docs/security.md): CI runs the pull request's own copy
of it. What it does about the data a pull request can commit next to it: setuptools builds in a
private temporary folder (a committed ``build/`` or ``*.egg-info`` is never read), a ``setup.cfg``
or ``MANIFEST.in`` (setuptools would read options, data files or an sdist's file list from them;
the fork has neither) is refused, and the apply runs isolated (``python -I``: nothing importable
from the checkout, such as a ``sitecustomize.py``, runs at interpreter start).
"""

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import find_namespace_packages, find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
STAMP = re.compile(r"^__version__ = '([^']+)'$", re.M)


# Files setuptools reads from the source folder on its own: build options, data files to install
# anywhere, an sdist's file list. The fork has none; one a pull request commits is refused.
SETUPTOOLS_INPUTS = ("setup.cfg", "MANIFEST.in")
# Runs the tool's apply with nothing of the checkout on the path at interpreter start (-I drops
# PYTHONPATH, the user site and the current folder), then puts the checkout's tools/ first.
APPLY = "import sys; sys.path.insert(0, sys.argv.pop(1)); from tools.rebase.cli import main; sys.exit(main(sys.argv[1:]))"


def building_from_sdist() -> bool:
    """True inside an unpacked sdist: it already holds the patched megatron/ and no patch stack (a
    git checkout never counts: a pull request could delete patches/ and commit PKG-INFO)."""
    return ((ROOT / "PKG-INFO").is_file() and not (ROOT / "patches").is_dir()
            and not os.path.lexists(ROOT / ".git"))


def refuse_setuptools_inputs() -> None:
    """A checkout's setup.cfg or MANIFEST.in is refused; an unpacked sdist carries the setup.cfg
    setuptools itself wrote into it (its egg_info tags), made from a checkout that had none."""
    if building_from_sdist():
        return
    found = [name for name in SETUPTOOLS_INPUTS if os.path.lexists(ROOT / name)]
    if found:
        sys.exit(f"{ROOT}: refusing to build with {', '.join(found)}: setuptools would take build options, "
                 f"files to install or the sdist's file list from it, and the fork has none (a pull request "
                 f"committed it?). Remove it; setup.py holds all of the build's settings.")


def private_build_folders() -> dict:
    """setuptools' build and egg-info folders in a fresh temporary folder, removed at exit: a
    ``build/lib`` or ``*.egg-info`` the checkout carries (committed, or left by an older build) is
    never copied into the wheel."""
    tmp = Path(tempfile.mkdtemp(prefix="megatron-fork-build-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    (tmp / "egg").mkdir()
    return {"build": {"build_base": str(tmp / "build")}, "egg_info": {"egg_base": str(tmp / "egg")}}


def materialize() -> None:
    if building_from_sdist():
        if not (ROOT / "megatron" / "core").is_dir():
            sys.exit("this sdist has no megatron/core: it was not built from a materialized checkout")
        return
    if os.environ.get("MEGATRON_FORK_SKIP_APPLY") == "1" and (ROOT / "megatron").is_dir():
        return
    cache = os.environ.get("FORK_REBASE_CACHE", str(ROOT / ".rebase" / "cache"))
    # pip hides a build backend's output unless it fails, so this line is for `pip install -v`
    # and for build tools that show it (python -m build does).
    print(
        f"megatron-core RL fork: materializing megatron/ = upstream pin ({ROOT / 'upstream.toml'}) "
        f"+ patches/; the upstream sdist (about 2 MB) is downloaded once into {cache} "
        f"(set FORK_REBASE_CACHE to share or pre-seed it)",
        file=sys.stderr,
        flush=True,
    )
    proc = subprocess.run([sys.executable, "-I", "-c", APPLY, str(ROOT), "-C", str(ROOT), "apply"], cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"materializing the patched tree failed (python -m tools.rebase apply exited {proc.returncode})")


def fork_version() -> str:
    info = (ROOT / "megatron" / "core" / "package_info.py").read_text()
    stamps = STAMP.findall(info)
    if not stamps:
        sys.exit("megatron/core/package_info.py carries no fork version stamp; run python -m tools.rebase apply")
    return stamps[-1]


# The tool is ``tools/rebase`` in the checkout (``python -m tools.rebase``) and ``megatron_rebase``
# when installed: site-packages gets no top-level ``tools`` package to clash with anyone else's.
TOOL = "megatron_rebase"
TOOL_DATA = {"git": ["gitattributes"]}  # the tool's files other than modules, by subpackage
TOOL_IMPORT = re.compile(r"^(\s*)(from|import)\s+tools\.rebase\b", re.M)


class BuildPy(build_py):
    """Copies tools/rebase as megatron_rebase, with its absolute ``tools.rebase`` imports renamed
    (only import statements: messages naming ``python -m tools.rebase`` stay as they are)."""

    def build_module(self, module, module_file, package):
        outfile, copied = super().build_module(module, module_file, package)
        if (package == TOOL or package.startswith(TOOL + ".")) and outfile.endswith(".py"):
            text = Path(outfile).read_text()
            renamed = TOOL_IMPORT.sub(lambda m: f"{m[1]}{m[2]} {TOOL}", text)
            if renamed != text:
                Path(outfile).write_text(renamed)
        return outfile, copied


refuse_setuptools_inputs()
materialize()

setup(
    options=private_build_folders(),
    name="megatron-core",
    version=fork_version(),
    description="Megatron-core with a maintained RL patch series (MTP, mHC, R3 routing replay)",
    long_description=(ROOT / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause AND Apache-2.0",
    python_requires=">=3.11",
    packages=find_namespace_packages(
        include=["megatron.core", "megatron.core.*", "megatron.training", "megatron.training.*"]
    ) + [TOOL] + [f"{TOOL}.{sub}" for sub in find_packages(str(ROOT / "tools" / "rebase"))],
    package_dir={TOOL: "tools/rebase"},
    cmdclass={"build_py": BuildPy},
    package_data={"megatron.core": ["requirements.txt", "README.md"],
                  **{f"{TOOL}.{sub}": files for sub, files in TOOL_DATA.items()}},
    entry_points={"console_scripts": [f"megatron-rebase = {TOOL}.launch:main"]},
    include_package_data=False,
    install_requires=[
        "torch>=2.6.0",
        "numpy",
        "packaging>=24.2",
        "typing_extensions",
        "einops",
        # Megatron-core imports triton at module level; CUDA builds of torch bring it themselves.
        "triton; platform_system == 'Linux'",
    ],
    extras_require={
        "te": ["transformer-engine[pytorch]"],
        "flash-attn": ["flash-attn"],
        "dev": ["pytest", "psutil", "build", "setuptools>=69", "wheel", "pyflakes>=3"],
    },
    zip_safe=False,
)
