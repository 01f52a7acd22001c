"""``patches/proof.json``: the committed record of ``prove --record`` -- one verdict per patch and
the digest of the stack they were proven on, so ``check`` and the README's Proof column can tell a
current record from a stale one without re-running anything. It is data: a pull request can
forge a "proven" record and recompute the digest, so it vouches for nothing CI has not re-proven."""

import json
from dataclasses import asdict
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.git.safefs import read_nofollow
from tools.rebase.stack.series import load_stack
from tools.rebase.stack.state import current_digest

PROOF_FILE = "proof.json"
PROVEN, UNPROVEN, GPU_ONLY = "proven", "unproven", "GPU-only"
FAILS_WITH = "fails with it"  # its Tests: fail on the whole stack: "fails without, passes with" does not hold


def proof_path(layout) -> Path:
    return layout.patches / PROOF_FILE


def stack_digest_now(layout) -> str:
    _, patches = load_stack(layout)
    return current_digest(layout, patches)


def write_record(layout, proofs: list, proved_digest: str) -> Path:
    """Write ``patches/proof.json`` for the whole current stack (atomic).

    ``proved_digest`` is the stack the proofs were made on (read before ``prove`` ran): an edit,
    apply or export during the run would otherwise get a record it was never proven for.
    """
    _, patches = load_stack(layout)
    if [p.name for p in proofs] != [p.name for p in patches]:
        raise RebaseError("--record needs a proof of every patch in the series (run prove without names)")
    if current_digest(layout, patches) != proved_digest:
        raise RebaseError(f"{layout.patches} or the pin changed while prove ran; nothing was recorded. "
                          f"Run prove --record again.")
    data = {
        "stack_digest": proved_digest,
        "patches": [asdict(p) for p in proofs],
    }
    path = proof_path(layout)
    from tools.rebase.git.safefs import read_nofollow, write_file

    try:  # keep the mutant scores (prove --mutants --record) next to the verdicts
        kept = json.loads(read_nofollow(path)).get("mutants") if path.is_file() else None
    except (OSError, ValueError, AttributeError):
        kept = None
    if kept is not None:
        data["mutants"] = kept
    write_file(layout.root, path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def _bad_entry(entry: dict):
    """Why a record entry cannot be shown (its fields reach the README table), else None."""
    if entry.get("verdict") not in (PROVEN, UNPROVEN, GPU_ONLY, FAILS_WITH):
        return f"verdict {entry.get('verdict')!r} is not one of {PROVEN}, {UNPROVEN}, {GPU_ONLY}, {FAILS_WITH}"
    for key in ("tests", "failed"):
        value = entry.get(key)
        if type(value) is not int or value < 0:
            return f"{key} {value!r} is not a count"
    return None


def _load(layout):
    """``(verdicts by name as recorded, recorded digest, problem)`` of a well-formed record, for
    whatever stack it was made on; a malformed record is a problem, not a stale one."""
    path = proof_path(layout)
    if not path.is_file():
        return {}, None, None
    where = layout.rel(path)
    try:
        data = json.loads(read_nofollow(path).decode("utf-8"))
        if isinstance(data, dict) and set(data) == {"mutants"}:
            return {}, None, None  # mutant scores recorded before any prove --record: no verdicts yet
        digest = data["stack_digest"]
        verdicts = {entry["name"]: entry for entry in data["patches"]}
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        return {}, None, f"{where}: not a proof record ({exc.__class__.__name__}: {str(exc)[:200]})"
    if not isinstance(digest, str):
        return {}, None, f"{where}: stack_digest {digest!r} is not a string"
    for entry in data["patches"]:
        bad = _bad_entry(entry)
        if bad:
            return {}, None, f"{where}: entry {entry.get('name')!r}: {bad}; run prove --record"
    return verdicts, digest, None


def recorded_verdicts(layout) -> dict:
    """The committed verdicts by patch name, whatever stack they were recorded on ({} when the
    record is missing or malformed): what the README's Proof column shows until the maintainer
    refreshes the record at release or bump time."""
    return _load(layout)[0]


def read_record(layout):
    """``(verdicts by patch name, problem)``: verdicts only when the record matches this stack.

    A record for another stack comes back as a problem that :func:`is_stale` tells apart from a
    malformed one: ``check`` reports the first as stale, the second as a failure."""
    verdicts, digest, problem = _load(layout)
    if problem or digest is None:
        return {}, problem
    where = layout.rel(proof_path(layout))
    _, patches = load_stack(layout)
    if digest != current_digest(layout, patches):
        return {}, (f"{where}: {STALE_MARK} (digest {digest[:12]}); "
                    f"refresh it with python -m tools.rebase prove --record{layout.line_flag}")
    if set(verdicts) != {p.name for p in patches}:
        return {}, f"{where}: does not cover exactly the patches of the series; run prove --record"
    return verdicts, None


STALE_MARK = "recorded for another stack"


def is_stale(problem) -> bool:
    """True for :func:`read_record`'s "another stack" problem (a well-formed, outdated record)."""
    return bool(problem) and STALE_MARK in problem
