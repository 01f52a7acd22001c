"""``edit PATCH``: put a change into a patch below the top of the stack, in one step.

The maintainer edits files where the whole stack is applied -- ``.rebase/work`` (uncommitted), or
with ``--from-tree`` the generated ``megatron/`` -- then names the patch the change belongs to.
The change becomes a ``fixup!`` commit of that patch's commit, a non-interactive
``git rebase --autosquash`` folds it in, and ``export`` writes ``patches/`` and ``megatron/``.
There is no half-way state to resume: when a later patch no longer applies over the change, the
rebase is undone and the work repo, ``patches/`` and ``megatron/`` are left as they were, with
the edits where they were made.
"""

import os
import stat

from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import git, git_proc, head_commit, is_clean
from tools.rebase.git.lock import locked
from tools.rebase.git.safefs import read_nofollow, write_file
from tools.rebase.stack.materialize import MANIFEST, STAMP_MARK, VERSION_FILE, local_edits
from tools.rebase.stack.series import load_stack, parse_trailers
from tools.rebase.stack.stack import chain_log, select
from tools.rebase.stack.state import read_state
from tools.rebase.stack.workrepo import _export, refuse_changed_patches, refuse_during_bump

PACKAGE = "megatron"


def edit(layout, wanted: str, from_tree: bool = False, other_files: bool = False, log=print) -> str:
    """Fold the pending change into the patch ``wanted`` (Patch-Name, file name or number) and
    export; return the patch's file name."""
    with locked(layout, "edit"):
        return _edit(layout, wanted, from_tree, other_files, log)


def _edit(layout, wanted, from_tree, other_files, log) -> str:
    refuse_during_bump(layout, "edit")
    work = layout.work
    if not (work / ".git").exists():
        raise RebaseError(f"{work} does not exist: run `python -m tools.rebase apply{layout.line_flag}` first")
    state = read_state(layout)
    refuse_changed_patches(layout, state)
    head = head_commit(work)
    if not state.get("tip") or head != state["tip"]:
        raise RebaseError(
            f"{work} HEAD ({(head or 'none')[:12]}) is not the stack last applied or exported: export "
            f"its commits first (edit folds uncommitted changes only). Nothing was changed.")
    _, patches = load_stack(layout)
    hits = select(patches, [wanted], "edit")
    if len(hits) != 1:
        raise RebaseError(f"edit: {wanted!r} names {len(hits)} patches; give its Patch-Name")
    patch = patches[hits[0]]
    target, owned = _commit_of(work, state["base"], head, patch.name)
    if from_tree:
        if not is_clean(work):
            raise RebaseError(f"{work} has uncommitted changes too: commit or discard them, or run edit "
                              f"without --from-tree to fold those instead. Nothing was changed.")
        edits = _tree_edits(layout)
        changed = [f"{PACKAGE}/{path}" for path in edits]
    else:
        git("add", "-A", cwd=work)
        changed = [p for p in git("diff", "--cached", "--name-only", "-z", "--no-renames", "HEAD",
                                  cwd=work).split("\0") if p]
    if not changed:
        where = f"{layout.rel(layout.package)}/ has no hand edits" if from_tree else f"{work} has no uncommitted changes"
        raise RebaseError(f"nothing to fold into {patch.path.name}: {where}")
    foreign = sorted(set(changed) - owned)
    if foreign and not other_files:
        if not from_tree:
            git("reset", "-q", cwd=work)  # unstage: the edits stay as they were
        raise RebaseError(
            f"the change touches {len(foreign)} file(s) {patch.path.name} does not: {', '.join(foreign[:10])}"
            f"{' ...' if len(foreign) > 10 else ''}. Put it into the patch that owns them, or pass "
            f"--other-files to fold it into {patch.name} anyway. Nothing was changed.")
    if from_tree:
        _copy_edits(layout, edits)
        git("add", "-A", cwd=work)
    _fold(work, head, target, patch.path.name, from_tree)
    _export(layout, log, edits_taken=from_tree)
    log(f"edit: folded {len(changed)} file(s) into {patch.path.name}; run "
        f"`python -m tools.rebase check{layout.line_flag}`")
    return patch.path.name


def _commit_of(work, base: str, head: str, name: str):
    """``(commit, files it touches)`` of the work-repo commit whose Patch-Name is ``name``."""
    for row in chain_log(work, base, head):
        if name in parse_trailers(row.message).get("Patch-Name", []):
            files = {line.split("\t", 1)[1] for line in row.raw.splitlines() if "\t" in line}
            return row.commit, files
    raise RebaseError(f"no commit of {work} carries Patch-Name {name!r}: run `python -m tools.rebase apply`")


def _tree_edits(layout) -> list:
    """Paths (relative to megatron/) edited by hand since the tool wrote it; refuses what cannot
    be carried over file by file."""
    edits = local_edits(layout.package)
    odd = [e for e in edits if e.startswith("(")]
    if odd:
        raise RebaseError(f"{layout.package}: {odd[0]}; rebuild it with `apply --force`")
    for path in edits:
        if os.path.islink(layout.package / path):
            raise RebaseError(f"{layout.package / path}: is a symlink; the package must not contain symlinks")
    return edits


def _copy_edits(layout, edits: list) -> None:
    """Write megatron/'s edited, added and removed files over the work repo's ``megatron/``; the
    version stamp apply adds to package_info.py is not carried."""
    for path in edits:
        source, dest = layout.package / path, layout.work / PACKAGE / path
        if not source.exists():
            if dest.is_file():
                dest.unlink()
            continue
        if path == VERSION_FILE.as_posix() and dest.is_file():
            text, original = read_nofollow(source).decode(), read_nofollow(dest).decode()
            stamp = text.find(f"\n\n{STAMP_MARK}")
            kept = text[:stamp] if stamp >= 0 else text
            write_file(layout.work, dest, kept.rstrip("\n") + original[len(original.rstrip("\n")):])
        elif path != MANIFEST:
            write_file(layout.work, dest, read_nofollow(source), stat.S_IMODE(os.lstat(source).st_mode))


def _fold(work, head: str, target: str, shown: str, from_tree: bool) -> None:
    """Commit the staged change as a fixup of ``target`` and squash it in; on failure undo all
    of it (the edits go back to being uncommitted, or, from the tree, are dropped from the work
    repo while megatron/ still holds them)."""
    from_target = len(git("rev-list", f"{target}^..{head}", cwd=work).split())
    git("commit", "-q", "--no-verify", f"--fixup={target}", cwd=work)
    proc = git_proc("rebase", "-q", "-i", "--autosquash", f"{target}^", cwd=work,
                    env={"GIT_SEQUENCE_EDITOR": "true"})
    # Every patch from the target up is still one commit (none dropped as empty, none left over).
    if proc.returncode == 0 and len(git("rev-list", f"{target}^..HEAD", cwd=work).split()) == from_target:
        return
    if (work / ".git" / "rebase-merge").is_dir():
        git_proc("rebase", "--abort", cwd=work)
    git("reset", "-q", "--hard" if from_tree else "--mixed", head, cwd=work)
    detail = (proc.stdout + proc.stderr).strip().splitlines()
    raise RebaseError(
        f"the change does not fold into {shown}: a later patch no longer applies over it"
        + (f" ({detail[-1]})" if detail else "") + ". Nothing was changed; the edits are still in "
        + ("megatron/" if from_tree else f"{work} (uncommitted)")
        + ". Fold it into the later patch instead, or rebase by hand in the work repo and export.")
