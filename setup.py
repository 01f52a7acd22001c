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
from the checkout, such as a ``sitecustomize.py``, runs at interpreter start). ``README.md`` is read
only as a plain file (a committed link would put an outside file into the wheel's METADATA), no
license file is collected (setuptools would copy a ``LICENSE``/``COPYING``/``NOTICE``/``AUTHORS``
link's target into the wheel), and the version is the tool's stamp alone: the last two lines of
``package_info.py``, its mark and one PEP 440 version, never another ``__version__`` line.

``MEGATRON_FORK_LINE=NAME`` builds the line in ``lines/NAME/`` instead of the release line:
``FORK_REBASE_MIRROR=PATH`` names a local clone of upstream to take the pinned commit from (no
network); without it the pinned commit comes from the tool's cache or, once, from upstream's
archive of that commit, checked against the tree digest the line's ``upstream.toml`` records. The
version then names the line (``0.19.0+rl.dev.40.<digest>``).
"""

import atexit
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import find_namespace_packages, find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# The tool's stamp (tools/rebase/stack/materialize.py): its mark, then one line in fixed quoting.
STAMP_MARK = "# --- stamped by tools.rebase when the fork was materialized ---"
STAMP = re.compile(r"^__version__ = '([0-9]+(?:\.[0-9]+)*(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?"
                   r"(?:\.dev[0-9]+)?\+[a-z0-9]+(?:\.[a-z0-9]+)*)'$")
LINE_ENV, MIRROR_ENV = "MEGATRON_FORK_LINE", "FORK_REBASE_MIRROR"
LINE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
README_LIMIT = 1 << 20  # bytes: the long description; the fork's README is about 12 kB


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
    args = ["apply", *line_arguments()]
    line = os.environ.get(LINE_ENV, "")
    home = ROOT / "lines" / line if line else ROOT
    source = (f"the pinned upstream commit is read from {os.environ[MIRROR_ENV]}" if os.environ.get(MIRROR_ENV)
              else f"the pinned upstream commit's archive is downloaded once into {cache}" if line
              else f"the upstream sdist (about 2 MB) is downloaded once into {cache}")
    # pip hides a build backend's output unless it fails, so this line is for `pip install -v`
    # and for build tools that show it (python -m build does).
    print(
        f"megatron-core RL fork: materializing megatron/ = upstream pin ({home / 'upstream.toml'}) "
        f"+ patches/ of the {line or 'release'} line; {source} "
        f"(set FORK_REBASE_CACHE to share or pre-seed it)",
        file=sys.stderr,
        flush=True,
    )
    proc = subprocess.run([sys.executable, "-I", "-c", APPLY, str(ROOT), "-C", str(ROOT), *args], cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"materializing the patched tree failed (python -m tools.rebase {' '.join(args)} exited "
                 f"{proc.returncode})")


def line_arguments() -> list:
    """The apply's arguments for ``MEGATRON_FORK_LINE`` (none for the release line): the line, and
    where its pinned commit comes from (``FORK_REBASE_MIRROR``, else the cache or the archive)."""
    line = os.environ.get(LINE_ENV, "")
    if not line:
        return []
    if not LINE_NAME.match(line) or not (ROOT / "lines" / line / "upstream.toml").is_file():
        known = sorted(p.name for p in (ROOT / "lines").glob("*") if (p / "upstream.toml").is_file())
        sys.exit(f"{LINE_ENV}={line!r}: no such line in {ROOT / 'lines'} (lines: {', '.join(known) or 'none'}; "
                 f"leave it unset for the release line)")
    mirror = os.environ.get(MIRROR_ENV, "")
    if mirror and not os.path.isabs(mirror):  # pip runs this in the source folder, not where it was typed
        sys.exit(f"{MIRROR_ENV}={mirror!r}: give the clone's absolute path")
    return ["--line", line, *(["--mirror", mirror] if mirror else ["--from-archive"])]


def fork_version() -> str:
    """The tool's stamp: the file's last two lines are its mark and the version, in fixed quoting.
    Any other ``__version__`` line (upstream's, or one a patch adds) is never taken."""
    info = read_plain_file(ROOT / "megatron" / "core" / "package_info.py", limit=README_LIMIT)
    tail = info.rstrip("\n").split("\n")[-2:]
    stamp = STAMP.match(tail[-1]) if len(tail) == 2 and tail[0] == STAMP_MARK else None
    if not stamp:
        sys.exit("megatron/core/package_info.py does not end in the fork's version stamp (its mark, then "
                 "__version__ = '<PEP 440 version>+<label>'); run python -m tools.rebase apply")
    return stamp[1]


def read_plain_file(path: Path, limit: int) -> str:
    """A regular file's text, never through a link (a committed link would put an outside file in
    the wheel), nor a FIFO or device; at most ``limit`` bytes, UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        sys.exit(f"{path}: cannot be read as a plain file ({exc.strerror}; a symlink is refused: "
                 f"the build reads only the checkout's own files)")
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            sys.exit(f"{path}: not a regular file; the build reads only plain files")
        if info.st_size > limit:
            sys.exit(f"{path}: {info.st_size} bytes, over the build's limit of {limit}")
        data = fh.read(limit + 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        sys.exit(f"{path}: not UTF-8 ({exc})")


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


def long_description() -> str:
    """README.md as the wheel's description: a plain file of the checkout (never a link's target);
    an unpacked sdist carries its description in PKG-INFO and may lack README.md."""
    readme = ROOT / "README.md"
    if building_from_sdist() and not os.path.lexists(readme):
        return ""
    return read_plain_file(readme, limit=README_LIMIT)


refuse_setuptools_inputs()
materialize()

setup(
    options=private_build_folders(),
    name="megatron-core",
    version=fork_version(),
    description="Megatron-core with a maintained RL patch series (MTP, mHC, R3 routing replay)",
    long_description=long_description(),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause AND Apache-2.0",
    # No license file is collected: setuptools' default patterns would copy a committed link's
    # target (LICENSE -> an outside file) into the wheel.
    license_files=[],
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
