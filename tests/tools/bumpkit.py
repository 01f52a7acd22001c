"""Helpers for the bump/report tests: tiny git repos built from file edits (no conftest, no fixtures)."""

import os
import subprocess
from pathlib import Path

ENV = dict(
    os.environ,
    GIT_CONFIG_GLOBAL=os.devnull,
    GIT_CONFIG_NOSYSTEM="1",
    GIT_AUTHOR_NAME="Test Author",
    GIT_AUTHOR_EMAIL="author@example.invalid",
    GIT_COMMITTER_NAME="Test Author",
    GIT_COMMITTER_EMAIL="author@example.invalid",
    GIT_AUTHOR_DATE="2026-01-01T00:00:00Z",
    GIT_COMMITTER_DATE="2026-01-01T00:00:00Z",
)


def sh(*args, cwd, env=None, check=True):
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env or ENV, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} failed: {proc.stdout}\n{proc.stderr}")
    return proc.stdout


def numbered(tag, n=40):
    return "".join(f"{tag} line {i}\n" for i in range(1, n + 1))


def write(repo: Path, edits: dict):
    for rel, transform in edits.items():
        target = repo / rel
        if transform is None:
            target.unlink()
            continue
        old = target.read_text() if target.exists() else ""
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(transform(old) if callable(transform) else transform)


def commit(repo: Path, edits: dict, message: str, date="2026-01-01T00:00:00Z") -> str:
    write(repo, edits)
    sh("git", "add", "-A", cwd=repo)
    env = dict(ENV, GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    sh("git", "commit", "-q", "--allow-empty", "-m", message, cwd=repo, env=env)
    return sh("git", "rev-parse", "HEAD", cwd=repo).strip()


def init(repo: Path, files: dict, message="base") -> str:
    repo.mkdir(parents=True, exist_ok=True)
    sh("git", "init", "-q", "-b", "main", cwd=repo)
    return commit(repo, files, message)


def branch_of_patches(repo: Path, base: str, patches, branch: str) -> str:
    """Create ``branch`` at ``base`` with one commit per ``(edits, message)``; return its tip."""
    sh("git", "checkout", "-q", "-b", branch, base, cwd=repo)
    for edits, msg in patches:
        commit(repo, edits, msg)
    return sh("git", "rev-parse", "HEAD", cwd=repo).strip()


def patch_msg(name, subject=None, body="Why it exists.", tests="tests/test_dummy.py::test_ok"):
    return (f"{subject or name}\n\n{body}\n\nPatch-Name: {name}\n"
            f"Upstream-Status: fork-only test fixture\nTests: {tests}\n")


def replace_line(old_text, new_text):
    def edit(text):
        assert old_text in text, (old_text, text[:200])
        return text.replace(old_text, new_text, 1)
    return edit


# Two one-line patches on two files of the stand-in upstream: the stack most line tests bump.
A, B = "megatron/core/alpha.py", "megatron/core/beta.py"
TWO_PATCH_STACK = [
    ("keep-alpha", {A: replace_line("alpha line 10\n", "alpha line 10 fork\n")}),
    ("tweak-beta", {B: replace_line("beta line 5\n", "beta line 5 fork\n")}),
]


def all_tests_pass(layout, name, ids):
    """A bump's test runner that reports every ``Tests:`` id as passed."""
    return {i: "passed" for i in ids}


def append(extra):
    return lambda text: text + extra


# ---------------------------------------------------------------- a fork checkout pinned to a git upstream

UPSTREAM_FILES = {
    "megatron/core/package_info.py": "MAJOR = 0\nMINOR = 42\nPATCH = 1\nPRE_RELEASE = ''\n__version__ = '0.42.1'\n",
    "megatron/core/__init__.py": "",
    "megatron/core/alpha.py": numbered("alpha"),
    "megatron/core/beta.py": numbered("beta"),
    "megatron/core/gamma.py": numbered("gamma"),
    "megatron/core/delta.py": numbered("delta"),
}


class Fork:
    def __init__(self, root: Path, upstream: Path, line=None):
        from tools.rebase.git.paths import Layout

        self.root, self.upstream = root, upstream
        self.layout = Layout(root, line)

    @property
    def work(self) -> Path:
        return self.layout.work

    def upstream_commit(self, edits, message, tag=None):
        sha = commit(self.upstream, edits, message)
        if tag:
            sh("git", "tag", "-f", tag, cwd=self.upstream)
        return sha

    def add_patch(self, name, edits, subject=None, body="Why it exists.", tests="tests/test_dummy.py::test_ok"):
        """Commit one patch in the work repo (apply first, export after: see ``stack``)."""
        commit(self.work, edits, patch_msg(name, subject, body, tests))

    def stack(self, patches):
        from tools.rebase.stack.workrepo import apply, export

        apply(self.layout, log=quiet)
        for args in patches:
            self.add_patch(*args)
        export(self.layout, log=quiet)

    def snapshot(self):
        """Everything a bump may touch, for exact before/after comparisons."""
        files = {}
        for path in sorted(self.root.rglob("*")):
            rel = path.relative_to(self.root).as_posix()
            if rel.startswith((".rebase/", "megatron/")) or not path.is_file():
                continue
            files[rel] = path.read_bytes()
        for extra in (".rebase/state.json",):
            p = self.root / extra
            files[extra] = p.read_bytes() if p.exists() else None
        work = {
            "refs": sh("git", "for-each-ref", "--format=%(refname) %(objectname)", cwd=self.work),
            "head": sh("git", "symbolic-ref", "-q", "HEAD", cwd=self.work, check=False),
            "sha": sh("git", "rev-parse", "HEAD", cwd=self.work),
            "status": sh("git", "status", "--porcelain", "--untracked-files=all", cwd=self.work),
            "config": (self.work / ".git" / "config").read_bytes(),
        }
        return files, work

    def patch_files(self):
        return {p.name: p.read_bytes() for p in sorted(self.layout.patches.glob("*")) if p.is_file()}


def quiet(*_a, **_k):
    pass


def all_pass(layout, name, ids):
    """A bump's test runner under which every Tests: id passes."""
    return {i: "passed" for i in ids}


def resolve_conflict(work: Path, rel: str, line: str) -> None:
    """Replace the one conflicted region of ``rel`` in the work repo by ``line`` and stage the file."""
    text = (work / rel).read_text()
    (work / rel).write_text(text.split("<<<<<<<")[0] + line + "\n" + text.split(">>>>>>>")[1].split("\n", 1)[1])
    sh("git", "add", rel, cwd=work)


def make_fork(tmp_path: Path, name="fork", files=None) -> Fork:
    """A fork checkout pinned to a synthetic git upstream (``files``, default UPSTREAM_FILES) at v1."""
    upstream = tmp_path / "upstream"
    if not upstream.exists():
        init(upstream, files or UPSTREAM_FILES, "upstream v1")
        sh("git", "tag", "v1", cwd=upstream)
    sha = sh("git", "rev-parse", "v1", cwd=upstream).strip()
    root = tmp_path / name
    (root / "patches").mkdir(parents=True)
    (root / "patches" / "series").write_text("# test series\n")
    (root / "upstream.toml").write_text(
        f'[upstream]\nkind = "git"\nurl = "{upstream}"\ncommit = "{sha}"\nref = "v1"\n')
    (root / "tests").mkdir()
    (root / "tests" / "test_dummy.py").write_text("def test_ok():\n    assert True\n")
    return Fork(root, upstream)


def add_line(fork: Fork, name: str, pin_text=None) -> Fork:
    """A second line ``lines/<name>/`` of ``fork``'s checkout: its own pin (default: a copy of the
    release line's) and an empty series; the returned Fork acts on that line."""
    home = fork.root / "lines" / name
    (home / "patches").mkdir(parents=True)
    (home / "patches" / "series").write_text("# line series\n")
    (home / "upstream.toml").write_text(pin_text if pin_text is not None else fork.layout.pin.read_text())
    return Fork(fork.root, fork.upstream, line=name)


# ---------------------------------------------------------------- the fork checkout as a git repo

def ignore_generated(fork: Fork) -> None:
    """What a real fork's .gitignore holds: the generated megatron/ and the tool's .rebase/."""
    (fork.root / ".gitignore").write_text("/megatron/\n/.rebase/\n")


def commit_checkout(fork: Fork, message: str) -> None:
    """Commit the fork checkout itself (``git init`` it first if needed), as a maintainer would."""
    if not (fork.root / ".git").exists():
        sh("git", "init", "-q", "-b", "main", cwd=fork.root)
    sh("git", "add", "-A", cwd=fork.root)
    sh("git", "commit", "-q", "-m", message, cwd=fork.root)


def assert_fresh_clone_report_is_the_committed_one(fork: Fork, tmp_path: Path) -> None:
    """A clone of the committed checkout, with an empty cache, regenerates the committed report byte
    for byte with plain ``report``: the record the report needs lives in history, not in .rebase/."""
    import sys

    md, js = fork.layout.report_md.read_bytes(), fork.layout.report_json.read_bytes()
    clone = tmp_path / "clone"
    sh("git", "clone", "-q", str(fork.root), str(clone), cwd=tmp_path)
    proc = subprocess.run([sys.executable, "-m", "tools.rebase", "-C", str(clone), "report"],
                          cwd=Path(__file__).resolve().parents[2],
                          env=dict(os.environ, FORK_REBASE_CACHE=str(tmp_path / "cache2")),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (clone / "REBASE_REPORT.json").read_bytes() == js
    assert (clone / "REBASE_REPORT.md").read_bytes() == md


def copy_with_markers(src: Path, dst: Path) -> None:
    """``copytree`` of a checkout or cache whose copy stands in for the original: the tool refuses a
    copied work, cache or backup repository (its marker is bound to the stamp file's inode and
    change time, ``git/owned.py``), so each marker found is made again in the copy."""
    import shutil

    from tools.rebase.git.owned import STAMP_SUFFIX, mark

    shutil.copytree(src, dst, symlinks=True)
    for stamp in list(Path(dst).rglob(f"*{STAMP_SUFFIX}")):
        marker = stamp.with_name(stamp.name[: -len(STAMP_SUFFIX)])
        first = marker.read_text().splitlines()[0]
        purpose = first.split("created by tools.rebase as ", 1)[1]
        stamp.unlink()
        marker.unlink()
        mark(marker.parent, marker.name, purpose)


def clone_with_resolutions(tmp_path: Path, fork: Fork, pin: bytes, patches: dict, monkeypatch) -> Fork:
    """Another machine: a fresh fork with ``fork``'s old pin and patches plus the resolutions a
    bump committed, on its own download cache; for tests that a recorded edit replays."""
    import shutil

    clone = make_fork(tmp_path, name="clone")
    clone.layout.pin.write_bytes(pin)
    for name, data in patches.items():
        (clone.layout.patches / name).write_bytes(data)
    shutil.copytree(fork.layout.resolutions, clone.layout.resolutions)
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache2"))
    return clone


def seeded_line_with_resolutions(tmp_path: Path, fork: Fork, pin: bytes, patches: dict, monkeypatch) -> Fork:
    """Another machine refreshes a line: the line holds what ``fork``'s bump exported (pin,
    patches, resolutions), its release line ``fork``'s old pin and patches, and ``seed`` gives the
    line the release line's; the returned Fork acts on the line. Its own versions of the patches
    (which may change files the release line's do not) are in the seed's backup."""
    import shutil

    from tools.rebase.stack.seed import seed_line
    from tools.rebase.stack.workrepo import apply

    clone = make_fork(tmp_path, name="clone")
    clone.layout.pin.write_bytes(pin)
    for name, data in patches.items():
        (clone.layout.patches / name).write_bytes(data)
    line = add_line(clone, "refresh", pin_text=fork.layout.pin.read_text())
    for name, data in fork.patch_files().items():
        (line.layout.patches / name).write_bytes(data)
    shutil.copytree(fork.layout.resolutions, line.layout.resolutions)
    monkeypatch.setenv("FORK_REBASE_CACHE", str(tmp_path / "cache2"))
    apply(line.layout, log=quiet)
    seed_line(line.layout, log=quiet)
    return line
