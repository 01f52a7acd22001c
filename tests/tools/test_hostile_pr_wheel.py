"""Issue 56, items 3, 4 and 9: what a data-only pull request can put into the wheel ``pip install .``
builds. A committed ``README.md`` link must not carry an outside file into the wheel's METADATA, a
``LICENSE``/``COPYING``/``NOTICE``/``AUTHORS`` link's target must not be copied into the wheel, and a
patch must not choose the wheel's version (a ``PRE_RELEASE`` whose quote flips the stamp's quoting,
with a ``__version__`` line of its own)."""

import os
import zipfile

import pytest

from tests.tools.bumpkit import commit, patch_msg, replace_line, sh
from tests.tools.hostile import pull_request
from tests.tools.test_hostile_pr_build import buildable_fork, pip_wheel

SECRET = "SECRET-3f1c9a: a file outside the checkout"

pytestmark = pytest.mark.slow  # each builds a wheel with pip (a few seconds on 2 cores)


def outside_file(tmp_path):
    secret = tmp_path / "outside" / "credentials.txt"
    secret.parent.mkdir()
    secret.write_text(SECRET + "\n")
    return secret


def wheel_text(wheel) -> str:
    with zipfile.ZipFile(wheel) as z:
        return "\n".join(z.read(n).decode("utf-8", "replace") for n in z.namelist() if not n.endswith("/"))


def test_a_readme_link_is_refused_and_nothing_outside_reaches_the_metadata(tmp_path):
    fork = buildable_fork(tmp_path)
    secret = outside_file(tmp_path)

    def payload(pr):
        (pr / "README.md").unlink()
        os.symlink(secret, pr / "README.md")

    ci = pull_request(fork, tmp_path, payload)
    assert (ci / "README.md").is_symlink()
    proc, wheels = pip_wheel(ci, tmp_path)
    assert SECRET not in "".join(wheel_text(w) for w in wheels)
    assert proc.returncode != 0 and not wheels
    assert "README.md" in proc.stderr and "symlink" in proc.stderr


@pytest.mark.parametrize("name", ["LICENSE", "COPYING.txt", "NOTICE", "AUTHORS.md", "LICENCE-extra"])
def test_a_license_link_target_is_not_copied_into_the_wheel(tmp_path, name):
    fork = buildable_fork(tmp_path)
    secret = outside_file(tmp_path)
    ci = pull_request(fork, tmp_path, lambda pr: os.symlink(secret, pr / name))
    proc, wheels = pip_wheel(ci, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with zipfile.ZipFile(wheels[0]) as z:
        assert not [n for n in z.namelist() if os.path.basename(n) == name], z.namelist()
    assert SECRET not in wheel_text(wheels[0])


def version_picking_patch(fork, tmp_path):
    """A patch file, made as a contributor would (format-patch of a commit on upstream v1), that
    sets ``PRE_RELEASE = "rc0'"`` and adds ``__version__ = '99.0.0'`` below it."""
    from tools.rebase.stack.stack import export_range

    author = tmp_path / "author"
    sh("git", "clone", "-q", str(fork.upstream), str(author), cwd=tmp_path)
    base = sh("git", "rev-parse", "v1", cwd=author).strip()
    info = "megatron/core/package_info.py"
    quoted = replace_line("PRE_RELEASE = ''\n", "PRE_RELEASE = \"rc0'\"\n")
    commit(author, {info: lambda text: quoted(text) + "__version__ = '99.0.0'\n"}, patch_msg("pick-version"))
    ((name, data),) = export_range(author, base, "HEAD")
    return name, data


def test_a_patch_cannot_choose_the_wheel_version(tmp_path):
    fork = buildable_fork(tmp_path)
    name, data = version_picking_patch(fork, tmp_path)

    def payload(pr):
        (pr / "patches" / name).write_bytes(data)
        with open(pr / "patches" / "series", "a") as series:
            series.write(f"{name}\n")

    ci = pull_request(fork, tmp_path, payload)
    proc, wheels = pip_wheel(ci, tmp_path)
    assert [w.name.split("-")[1] for w in wheels if "99.0.0" in w.name] == []
    assert proc.returncode != 0 and not wheels
    assert "PRE_RELEASE" in proc.stderr and "package_info.py" in proc.stderr and "PEP 440" in proc.stderr


def test_setup_reads_the_version_from_the_stamp_only(tmp_path):
    """A materialized tree whose stamp is not its last line (a ``__version__`` line after it, or
    none) gives no version at all: setup.py never falls back to another ``__version__`` line."""
    fork = buildable_fork(tmp_path)
    proc, wheels = pip_wheel(fork.root, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = fork.root / "megatron" / "core" / "package_info.py"
    text = info.read_text()
    assert text.rstrip().splitlines()[-1].startswith("__version__ = '0.42.1+rl.")
    info.write_text(text + "__version__ = '99.0.0+rl.1.x'\n")
    env_skip = {"MEGATRON_FORK_SKIP_APPLY": "1"}
    proc, wheels = pip_wheel(fork.root, tmp_path, env=env_skip)
    assert proc.returncode != 0 and not [w for w in wheels if "99.0.0" in w.name]
    assert "version stamp" in proc.stderr
