"""Before a bump changes anything: the pins (spec -> ``Pin``, journal TOML -> ``Pin``), the
refusals over unsaved work, and a work repo that holds exactly ``patches/``."""

from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.stack.materialize import local_edits
from tools.rebase.stack.pin import Pin, parse_spec, pin_from_table
from tools.rebase.stack.gitsource import git_tree_digest, resolve_git_ref
from tools.rebase.stack.source import download_sdist, sha256_file


def _pin_from_toml(text: str) -> Pin:
    import tomllib

    return pin_from_table(tomllib.loads(text)["upstream"], where="bump journal")


def resolve_spec(layout, spec: str) -> Pin:
    kind, a, b = parse_spec(spec)
    if kind == "pypi":
        path = download_sdist(layout.cache, a, b)
        return Pin("pypi", package=a, version=b, sha256=sha256_file(path))
    url = a
    local = Path(url).expanduser()
    if local.exists():
        url = str(local.resolve())
    commit = resolve_git_ref(layout.cache, url, b)
    # An abbreviated id (d98e8a64) is pinned as the full id it resolved to, not kept as a ref.
    return Pin("git", url=url, commit=commit, ref="" if commit.startswith(b) else b)


def _base_label(pin: Pin) -> str:
    return f"{pin.package} {pin.version}" if pin.kind == "pypi" else f"{pin.url}@{(pin.ref or pin.commit[:12])}"


def _refuse_package_edits(layout, why: str) -> None:
    edits = local_edits(layout.package)
    if edits:
        shown = ", ".join(edits[:10]) + (" ..." if len(edits) > 10 else "")
        raise RebaseError(f"{layout.package} has local edits ({shown}); {why}. Edits belong in the "
                          f"work repo ({layout.work}), exported to patches/.")


def _refuse_unsaved_work(layout) -> None:
    """Refuse before anything changes: hand edits in megatron/ (re-materialized for the tests and
    on abort) and *.patch files the series does not list (the bump's export would delete them)."""
    from tools.rebase.stack.series import read_series

    _refuse_package_edits(layout, "a bump would overwrite them")
    listed = set(read_series(layout.series).names) if layout.series.is_file() else set()
    unlisted = sorted(p.name for p in layout.patches.glob("*.patch") if p.name not in listed)
    if unlisted:
        raise RebaseError(f"{layout.patches} holds patch files the series does not list: {', '.join(unlisted)}; "
                          f"the bump's export would delete them: add them to the series or move them away")


def _ensure_applied(layout) -> None:
    """Make the work repo hold exactly patches/ on the pin (cheap when it already does)."""
    from tools.rebase.stack.series import load_stack
    from tools.rebase.stack.state import current_digest, read_state
    from tools.rebase.stack.workrepo import apply, guard_work_repo

    state = read_state(layout)
    if (layout.work / ".git").exists() and state.get("tip"):
        _, patches = load_stack(layout)
        if state.get("digest") == current_digest(layout, patches):
            guard_work_repo(layout, state)  # clean, and HEAD is the stack last applied/exported
            return
    apply(layout, log=lambda *_: None, package=False)  # megatron/ is the bump's to keep as it was
