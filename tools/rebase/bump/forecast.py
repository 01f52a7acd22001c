"""``bump --onto SPEC --dry-run``: what a bump would meet, without doing it.

The whole stack is replayed by the real bump code in a scratch checkout: a copy of the pin and
``patches/`` and a scratch work repo that borrows the real one's objects (git alternates) and refs,
so nothing is imported twice. Every stop (conflict or post-merge lint finding) is recorded with its
causes and the patch is dropped in the scratch so the replay goes on, as a maintainer dropping it
would: later patches that needed its context then show up too. The checkout, pin, ``patches/``,
the work repo and its rerere cache are left exactly as they were.

Only reading the checkout, the forecast does not take its lock (it runs next to another command, or
inside one that holds it); the scratch bump has its own journal, lock and rr-cache, ignores the
kill points, and never touches ``megatron/``. What would make a real bump refuse to start (local
edits in ``megatron/``, unlisted patch files, a bump in progress) is reported as a warning.
"""

import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.git.gitcmd import git, git_proc, init_borrowing
from tools.rebase.git.owned import WORK_MARKER, WORK_PURPOSE, mark
from tools.rebase.git.paths import Layout
from tools.rebase.stack.state import read_state
from tools.rebase.git.owned import WORK_MARKER, WORK_PURPOSE, mark
from tools.rebase.git.safefs import copy_entry, makedirs, write_file
from tools.rebase.stack.seed import seed_backup

SCHEMA = "fork-rebase-forecast/1"


@dataclass(frozen=True)
class ScratchLayout(Layout):
    """A layout whose download cache is the real checkout's (sdists and upstream mirrors)."""

    shared_cache: Path = None

    @property
    def cache(self) -> Path:
        return self.shared_cache


def _scratch(layout, tmp: Path) -> ScratchLayout:
    root = tmp / "checkout"
    root.mkdir()
    copy_entry(root, layout.pin, root / "upstream.toml")
    from tools.rebase.stack.series import read_series

    listed = set(read_series(layout.series).names)
    # Only what the series lists (and the recorded resolutions): a stray *.patch file is not part of
    # the stack, it only makes a real bump refuse (reported as a warning). Links stay links, so the
    # scratch refuses them as a real bump would, instead of copying their targets in.
    copy_entry(root, layout.patches, root / "patches",
               ignore=lambda d, names: [n for n in names if Path(d) == layout.patches
                                             and n.endswith(".patch") and n not in listed])
    scratch = ScratchLayout(root, shared_cache=layout.cache)
    backup = seed_backup(layout)
    if backup.is_dir() and not backup.is_symlink():  # a seeded line: its own versions of the patches
        makedirs(root, scratch.state_dir)
        copy_entry(root, backup, seed_backup(scratch))
    real = layout.work
    if (real / ".git").is_dir():
        work = scratch.work
        work.mkdir(parents=True)
        init_borrowing(work, real, "-b", "patched")
        # the tool made this repo here: when the stack must be rebuilt in it (a line just seeded),
        # apply's check for a foreign work repo must not refuse it
        mark(work / ".git", WORK_MARKER, WORK_PURPOSE)
        refs = git("for-each-ref", "--format=%(objectname) %(refname)", "refs/tags/upstream/",
                   "refs/upstream-history/", "refs/heads/patched", cwd=real)
        feed = "".join(f"update {ref} {sha}\n" for sha, ref in (line.split(" ", 1) for line in refs.splitlines()))
        if feed:
            git("update-ref", "--stdin", cwd=work, input=feed)
        tip = read_state(layout, tolerate_corrupt=True).get("tip")
        if tip and git_proc("cat-file", "-e", f"{tip}^{{commit}}", cwd=work).returncode == 0:
            copy_entry(root, layout.state_file, scratch.state_file)  # the stack is built: reuse it
            git("update-ref", "refs/heads/patched", tip, cwd=work)
            git("checkout", "-q", "-f", "patched", cwd=work)
    return scratch


def _stop_entry(j) -> dict:
    s = j.stopped
    entry = {"index": s.index, "name": j.names[s.index], "kind": s.kind, "files": s.files}
    if s.analysis:
        a = s.analysis
        entry.update(types=a["types"], causes=a["causes"], also=a["also"])
        entry["lent"] = [c["line"] for c in a.get("lent", []) if c["files"] and not c["missing"]]
        since = {p: i["upstream_from"] for p, i in a["files"].items() if i.get("upstream_from")}
        if since:  # old base is an sdist: where each file's upstream history was read from
            entry["history_from"] = since
        dropped = {o.old: o.name for o in j.outcomes if o.outcome == "dropped"}
        entry["after_dropped"] = [dropped[c] for c in a.get("old_context", []) if c in dropped]
    if s.findings:
        entry["findings"] = [f["message"] for f in s.findings]
    return entry


def _would_refuse(layout) -> list:
    """Why a real ``bump --onto`` would refuse to start in this checkout now (checked, not changed)."""
    from tools.rebase.bump import journal as jr
    from tools.rebase.bump.prepare import _refuse_unsaved_work

    out = []
    if jr.in_progress(layout):
        out.append("a bump is in progress in this checkout: a real bump would refuse to start until "
                   "it is continued or aborted")
    try:
        _refuse_unsaved_work(layout)
    except RebaseError as exc:
        out.append(f"a real bump would refuse to start now: {exc}")
    return out


def _no_kill(point, **info):
    """The scratch bump is thrown away: the kill points (``killpoints.py``) are not for it."""


def forecast(layout, spec: str, resolutions_from=None) -> dict:
    """Replay the stack onto ``spec`` in a scratch copy; return the forecast as data.
    ``resolutions_from`` (another line's Layout) lends its recorded resolutions, read in place."""
    from tools.rebase.bump.bump import Bump, Stopped

    class DryBump(Bump):
        def _finish(self):  # no pin, export or report: the forecast is the product
            return None

        def _lint_finished_stack(self):  # each patch was linted as it was replayed; stops are dropped
            return None

    if not layout.pin.is_file():
        raise RebaseError(f"{layout.pin}: upstream pin file is missing")
    refusals = _would_refuse(layout)
    with tempfile.TemporaryDirectory(prefix="rebase-forecast-") as tmp:
        scratch = _scratch(layout, Path(tmp))
        b = DryBump(scratch, log=lambda *_: None, hook=_no_kill, run_tests=False, resolutions_from=resolutions_from,
                    allow_downgrade=True, lend_home=layout,  # a dry run only warns; the real lines lend
                    allow_broken_premise=True)
        stops = {}
        try:
            b.start(spec)
        except Stopped:
            while True:
                stops[b.j.stopped.index] = _stop_entry(b.j)
                try:
                    b.resume(drop=True)
                    break
                except Stopped:
                    continue
        j = b.j
        data = {
            "schema": SCHEMA,
            "onto": spec,
            "stack": _stack_json(layout),
            "old_base": _pin_json(j.old_pin),
            "new_base": _pin_json(j.new_pin),
            "patches": [],
        }
        from tools.rebase.analysis.basecompare import downgrade_warnings
        from tools.rebase.bump.prepare import _pin_from_toml

        data["warnings"] = refusals + downgrade_warnings(scratch.work, j.old_base, j.new_base,
                                                         _pin_from_toml(j.old_pin), _pin_from_toml(j.new_pin))
        data["warnings"] += [f"a real bump would refuse: {p}" for p in b.premise_broken]
        upstream = _upstream_count(scratch.work, data["old_base"], data["new_base"])
        if upstream is not None:
            data["upstream_commits"] = upstream
        by_index = {o.index: asdict(o) for o in j.outcomes}
        for k, stop in stops.items():  # what dropping it would leave behind
            stop["if_dropped"] = by_index.get(k, {}).get("note", "")
        for k, name in enumerate(j.names):
            o = by_index.get(k, {})
            row = {"number": k + 1, "name": name}
            if k in stops:
                stop = stops[k]
                row.update(status="lint finding" if stop["kind"] == "lint" else "conflict",
                           **{key: v for key, v in stop.items() if key not in ("index", "name", "kind")})
            elif o.get("outcome") == "absorbed":
                row.update(status="absorbed", upstream=o.get("upstream", ""), how=o.get("how", ""))
            elif o.get("outcome") == "resolved-recorded" and o.get("how"):  # --resolutions-from
                row["status"] = f"resolved by a recorded resolution of {o['how']}"
            elif o.get("outcome") == "resolved-recorded":
                row["status"] = "resolved (recorded resolution)"
            elif o.get("outcome") == "dropped":  # recorded in the line's patches/dropped
                row.update(status="dropped", note=o.get("note", ""))
            else:
                row["status"] = "clean"
            data["patches"].append(row)
    data["would_stop"] = bool(stops)
    data["lendable"] = sum(1 for stop in stops.values() if stop.get("lent"))
    counts = {}
    for row in data["patches"]:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    data["counts"] = counts
    return data


def _stack_json(layout) -> dict:
    """The series the forecast was made from, so a committed forecast can be told stale."""
    from tools.rebase.proof.record import stack_digest_now
    from tools.rebase.stack.series import read_series

    return {"digest": stack_digest_now(layout), "patches": read_series(layout.series).names}


def outcome(data: dict) -> str:
    """One line: the counts and where a real bump would stop (printed whatever the outputs)."""
    shown = ", ".join(f"{n} {s}" for s, n in sorted(data["counts"].items()))
    stops = [row for row in data["patches"] if row["status"] in ("conflict", "lint finding")]
    if stops:
        return f"{shown}: a real bump would stop at {stops[0]['number']:04d} {stops[0]['name']}"
    return f"{shown}: a real bump would run through"


def _pin_json(toml_text: str) -> dict:
    import tomllib

    table = tomllib.loads(toml_text)["upstream"]
    return {k: table[k] for k in sorted(table)}


def _upstream_count(work: Path, old: dict, new: dict):
    if old.get("kind") != "git" or new.get("kind") != "git":
        return None
    proc = git_proc("rev-list", "--count", f"{old['commit']}..{new['commit']}", cwd=work)
    return int(proc.stdout) if proc.returncode == 0 else None


def _base_text(pin: dict) -> str:
    if pin["kind"] == "pypi":
        return f"`{pin['package']}=={pin['version']}` (sdist sha256 `{pin['sha256']}`)"
    ref = f" `{pin['ref']}`" if pin.get("ref") else ""
    return f"`{pin['url']}`{ref} at commit `{pin['commit']}`"


def render(data: dict) -> str:
    out = ["<!-- Generated by `python -m tools.rebase bump --onto SPEC --dry-run`; do not edit by hand. -->",
           "", "# Bump forecast", "",
           f"- From: {_base_text(data['old_base'])}",
           f"- Onto: {_base_text(data['new_base'])}"]
    if "upstream_commits" in data:
        out.append(f"- Upstream commits between the bases: {data['upstream_commits']}")
    if "stack" in data:
        stack = data["stack"]
        out.append(f"- Stack: {len(stack['patches'])} patches (digest `{stack['digest'][:12]}`)")
    out += [f"- **Warning**: {w}" for w in data.get("warnings", [])]
    stops = sum(1 for row in data["patches"] if row["status"] == "conflict")
    if stops and "lendable" in data:  # forecasts made before lines lent their versions lack it
        out.append(f"- Conflicts another line's version of the patch resolves: {data['lendable']} of "
                   f"{stops} (`bump --continue --take-from LINE` at each)")
    out += [f"- Outcome: {outcome(data)}", "",
            "Stops are dropped in the scratch replay so it can go on; a patch that needed a dropped "
            "patch's context says so.", "",
            "| # | Patch | Forecast | Detail |", "|---|---|---|---|"]
    for row in data["patches"]:
        out.append(f"| {row['number']:04d} | `{row['name']}` | {row['status']} | {_cell(_detail(row))} |")
    for row in data["patches"]:
        if row["status"] not in ("conflict", "lint finding"):
            continue
        out += ["", f"## {row['number']:04d} {row['name']}: {row['status']}", ""]
        for path in row["files"]:
            kind = row.get("types", {}).get(path)
            since = row.get("history_from", {}).get(path)
            since = f"; upstream history read from `{since[:12]}`, its closest version to the old base" if since else ""
            out.append(f"- `{path}`" + (f" ({kind} conflict{since})" if kind else ""))
        for finding in row.get("findings", []):
            out.append(f"- lint (clean merge, broken file): {finding}")
        if row.get("causes"):
            out += ["", "Upstream commits that changed the conflicting lines:", ""]
            out += [f"- `{c['commit'][:12]}` {_cell(c['subject'])}" + (f" ({_cell(c['how'])})" if c.get("how") else "")
                    for c in row["causes"]]
        if row.get("also"):
            out += ["", "Also touched these files:", ""]
            out += [f"- `{c['commit'][:12]}` {_cell(c['subject'])}" for c in row["also"]]
        if row.get("lent"):
            out += ["", f"Resolved by the version of: {', '.join(row['lent'])} (`--take-from`)."]
        if row.get("after_dropped"):
            out += ["", f"Its conflicting context came from {', '.join(row['after_dropped'])}, dropped above."]
        if row.get("if_dropped"):
            out += ["", f"If dropped: {row['if_dropped'].replace('removed on purpose by the maintainer; ', '')}."]
    return "\n".join(out) + "\n"


def _detail(row: dict) -> str:
    if row["status"] == "absorbed":
        up = f"upstream {row['upstream'][:12]}" if row.get("upstream") else "already in the new base"
        return f"{up} ({row['how']})" if row.get("how") else up
    if row["status"] == "conflict":
        types = sorted(set(row.get("types", {}).values()))
        causes = ", ".join(c["commit"][:12] for c in row.get("causes", []))
        text = f"{'/'.join(types) or 'conflict'} in {', '.join(row['files'])}"
        if causes:
            text += f"; caused by {causes}"
        if row.get("after_dropped"):
            text += f"; context from dropped {', '.join(row['after_dropped'])}"
        if row.get("lent"):
            text += f"; {', '.join(row['lent'])}'s version resolves it"
        return text
    if row["status"] == "lint finding":
        return "; ".join(row.get("findings", []))
    if row["status"] == "dropped":
        return row.get("note", "").replace("removed on purpose by the maintainer; ", "")
    return ""


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def write(data: dict, md: Path = None, js: Path = None) -> None:
    for path, text in ((md, render(data)), (js, json.dumps(data, indent=2, sort_keys=True) + "\n")):
        if path:
            write_file(Path(path).parent, Path(path), text)
