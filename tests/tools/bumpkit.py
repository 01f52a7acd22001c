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


def patch_msg(name, subject=None, body="Why it exists.", tests="tests/test_dummy.py::test_ok"):
    return (f"{subject or name}\n\n{body}\n\nPatch-Name: {name}\n"
            f"Upstream-Status: fork-only test fixture\nTests: {tests}\n")


def replace_line(old_text, new_text):
    def edit(text):
        assert old_text in text, (old_text, text[:200])
        return text.replace(old_text, new_text, 1)
    return edit


def append(extra):
    return lambda text: text + extra
