"""Benchmark (not a test): ``report`` measured on NVIDIA Megatron-LM's own cherry-picks.

Upstream moves commits between ``main`` and its ``core_r0.*`` / ``core_dev_r0.*`` branches as
picks whose subjects name the original pull request (``cp: `subject (6520)` into `core_r0.19.0```,
``[dev] ... (cherry-pick #5843) (#6088)``, ``... (#4522) (#4826)``). A pick and its original are one
change seen on two bases, with real conflict resolutions and partial picks: a corpus with an
answer key. Nothing upstream is stored in this checkout: the stacks are rebuilt at run time in a
scratch repository that borrows the mirror's objects. Per branch B (base = merge-base of main and B):

- ``pick``: old stack = the main originals of B's picks, new stack = B's own commits, both replayed
  onto the base; key: original <-> pick by PR number (B's other commits are new).
- ``bump``: old stack = B's commits on the base; new base = main as it stood at B's last commit;
  new stack = the old commits that are no pick of a main commit in that range, replayed onto it
  (those that no longer apply are dropped); key: picks are absorbed by their original, the others
  pair with their own replay. In every run of 4 to 8 replayed commits the new stack is also reshaped
  as a fork reshapes its own: one commit dropped (key: dropped, never absorbed), two that are no
  neighbours and share no subject word put into one commit with a message of its own (key:
  regrouped), and two neighbours squashed with both subjects in the message (key: merged).

Prints per scenario and in total: pairing accuracy (key pairs the report puts on one row) and
precision, absorption precision/recall (rows absorbed or likely-absorbed vs the key) and how often
the named upstream commit is the original, the fork-side reshapes read right, and the time of each
``build_report``.

    python bench/report_corpus.py --mirror DIR [--branches core_r0.19.0,...] [--work DIR]

``--mirror`` defaults to ``$MEGATRON_LM_MIRROR``: a bare clone (or mirror) of NVIDIA/Megatron-LM.
"""

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.rebase.report.report import build_report  # noqa: E402

MIRROR_ENV = "MEGATRON_LM_MIRROR"
BRANCHES = ("core_r0.12.0", "core_r0.13.0", "core_r0.14.0", "core_r0.15.0", "core_r0.16.0", "core_r0.17.0",
            "core_r0.18.0", "core_r0.19.0", "core_dev_r0.15.0", "core_dev_r0.16.0")
_OWN = re.compile(r"\(#(\d{2,6})\)\s*$")
_REFS = (re.compile(r"#(\d{2,6})\b"), re.compile(r"\((\d{2,6})\)`"),
         re.compile(r"cherry[- ]?pick(?:ed)?\s+(?:of\s+|from\s+)?(?:PR\s*)?#?(\d{3,6})\b", re.I))
ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_AUTHOR_NAME": "corpus",
       "GIT_AUTHOR_EMAIL": "corpus@example.invalid", "GIT_COMMITTER_NAME": "corpus",
       "GIT_COMMITTER_EMAIL": "corpus@example.invalid", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
       "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z", "LC_ALL": "C"}


def git(repo, *args, input=None, env=None, check=True) -> str:
    full = dict(os.environ, **ENV, **(env or {}))
    proc = subprocess.run(["git", *args], cwd=repo, input=input, env=full, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:3])} in {repo}: {proc.stderr.strip()[:300]}")
    return proc.stdout


# ------------------------------------------------------------------ the answer key (PR numbers)

def own_pr(subject: str) -> str:
    """The pull request that landed a commit: the ``(#N)`` closing its subject, or ""."""
    m = _OWN.search(subject)
    return m.group(1) if m else ""


def referenced_prs(subject: str, body: str = "") -> set:
    """The other pull requests a commit names as its origin (a pick's original)."""
    m = _OWN.search(subject)
    head = subject[: m.start()] if m else subject
    found = set()
    for pattern in _REFS[:2]:
        found.update(pattern.findall(head))
    found.update(_REFS[2].findall(body))
    return found - {own_pr(subject)}


def read_commits(repo, rev_range: str) -> list:
    """``[(sha, subject, body)]`` of the non-merge commits of ``rev_range``, oldest first."""
    out = git(repo, "log", "--reverse", "--topo-order", "--no-merges", "--format=%x01%H%x02%s%x02%b", rev_range)
    rows = []
    for chunk in out.split("\x01")[1:]:
        sha, subject, body = (chunk.split("\x02") + ["", ""])[:3]
        rows.append((sha, subject, body.strip()))
    return rows


def pick_key(branch: list, main: list) -> dict:
    """``{branch commit: main commit}``: a branch commit naming a main commit's PR as its origin, or
    (a forward port) a main commit naming the branch commit's PR. Lists as ``read_commits``."""
    landed_main = {own_pr(s): sha for sha, s, _ in main if own_pr(s)}
    names_main = {}
    for sha, s, b in main:
        for pr in referenced_prs(s, b):
            names_main.setdefault(pr, sha)
    key = {}
    for sha, s, b in branch:
        hits = [landed_main[pr] for pr in sorted(referenced_prs(s, b)) if pr in landed_main]
        if not hits and own_pr(s) in names_main:
            hits = [names_main[own_pr(s)]]
        if hits:
            key[sha] = hits[0]
    return key


# ------------------------------------------------------------------ stacks rebuilt in a scratch repo

def scratch_repo(work: Path, mirror: Path) -> Path:
    repo = work / "corpus.git"
    if not repo.exists():
        git(work, "init", "-q", "--bare", str(repo))
        (repo / "objects" / "info" / "alternates").write_text(str(Path(mirror).resolve() / "objects") + "\n")
    return repo


def _diffs(repo, shas: list) -> dict:
    out = {}
    for k in range(0, len(shas), 200):
        text = git(repo, "show", "--format=%x01%H", "--full-index", "--binary", "-p", "--first-parent", *shas[k:k + 200])
        for chunk in text.split("\x01")[1:]:
            sha, _, diff = chunk.partition("\n")
            out[sha] = diff.strip("\n") + "\n"
    return out


def replay(repo: Path, base: str, commits: list, work: Path) -> tuple:
    """Apply ``commits`` (``read_commits`` rows) one by one onto ``base`` (3-way, no work tree):
    ``(tip, {original: replayed commit}, {original whose change was there already})``; a commit that
    does not apply, or changes nothing, is left out."""
    return replay_units(repo, base, [([c], "") for c in commits], work)


def replay_units(repo: Path, base: str, units: list, work: Path) -> tuple:
    """``replay`` of ``[(commits, message)]``: each unit's commits applied together as one commit
    (its own message when ``message`` is "", else ``message``); a unit any of whose commits does not
    apply is left out whole. ``{original: replayed commit}`` maps every commit of a unit."""
    index = work / "replay.index"
    env = {"GIT_INDEX_FILE": str(index)}
    git(repo, "read-tree", base, env=env)
    diffs = _diffs(repo, [sha for commits, _ in units for sha, _, _ in commits])
    tip, tree = base, git(repo, "rev-parse", f"{base}^{{tree}}").strip()
    made, there = {}, set()
    for commits, message in units:
        todo = [diffs.get(sha, "") for sha, _, _ in commits]
        if not all(d.strip() for d in todo):
            continue
        shutil.copyfile(index, str(index) + ".bak")
        for diff in todo:
            proc = subprocess.run(["git", "apply", "--cached", "--3way", "-"], cwd=repo, input=diff, text=True,
                                  capture_output=True, env=dict(os.environ, **ENV, **env))
            if proc.returncode != 0:
                break
        if proc.returncode != 0:
            shutil.copyfile(str(index) + ".bak", index)
            continue
        new_tree = git(repo, "write-tree", env=env).strip()
        if new_tree == tree:
            there.update(sha for sha, _, _ in commits)
            continue
        if not message:
            sha, subject, body = commits[0]
            message = subject + ("\n\n" + body if body else "")
        tip = git(repo, "commit-tree", new_tree, "-p", tip, "-F", "-", input=message + "\n").strip()
        tree = new_tree
        made.update((sha, tip) for sha, _, _ in commits)
    return tip, made, there


# ------------------------------------------------------------------ fork-side reshapes of the new stack

_WORDS = re.compile(r"[A-Za-z]{3,}")
_COMMON = frozenset("the and for with from into when not are was use add fix fixes update bump make cherry pick "
                    "main core dev release support".split())
REGROUP_MESSAGE = "Regrouped changes of the release branch\n\nKept together in one commit of the new stack."


def subject_words(subject: str) -> set:
    """Content words of a subject, PR numbers and common words left out: two subjects sharing
    none are two topics."""
    return {w.lower() for w in _WORDS.findall(subject)} - _COMMON


def changed_lines(repo, commit: str) -> list:
    """The commit's added and removed lines, sorted (no context, no offsets)."""
    out = git(repo, "show", "--format=", "--no-color", "-U0", commit)
    return sorted(line for line in out.splitlines() if line[:1] in "+-" and not line.startswith(("+++ ", "--- ")))


def whole(repo, made: dict) -> set:
    """The originals whose replay onto the new base is the same change (same changed lines): no
    part of them is in the new base already, so the fork alone decides where they go; and no other
    of them makes that change too (twins a reader cannot tell apart)."""
    lines = {sha: changed_lines(repo, sha) for sha in made}
    seen = {}
    for sha, found in lines.items():
        seen.setdefault(tuple(found), []).append(sha)
    return {sha for sha, replayed in made.items()
            if lines[sha] == changed_lines(repo, replayed) and len(seen[tuple(lines[sha])]) == 1}


def files_of(repo, shas) -> dict:
    """``{sha: set of paths it changes}``."""
    return {sha: set(git(repo, "show", "--format=", "--name-only", sha).split()) for sha in shas}


def reshape(rows: list, made: dict, eligible=None, files=None) -> tuple:
    """``(units, shapes)``: the replayed commits ``rows`` (``read_commits`` rows, old order; only
    those in ``made`` count), those of them ``eligible`` (default: all) cut in runs of up to 8, and
    in each run of at least 4: the first commit and the first later one two places on or more whose
    subject shares no word with it, and none of whose files (``files``: ``{sha: paths}``) a commit
    between them changes (it moves up to the first), regrouped (the commit after the first stays on
    its own, so they are no neighbours), then one commit dropped, then two neighbours among the
    replayed commits squashed. The dropped one is the first left whose files no later commit
    changes (nothing builds on it). ``shapes``: ``{"dropped": [sha], "regrouped": [(a,
    b)], "merged": [(a, b)]}``."""
    live = [r for r in rows if r[0] in made]
    pool = [r for r in live if eligible is None or r[0] in eligible]
    files = files or {}
    at = {r[0]: k for k, r in enumerate(live)}

    def movable(a, b):
        mine = files.get(b[0], set())
        return not any(files.get(r[0], set()) & mine for r in live[at[a[0]] + 1:at[b[0]]])

    def independent(r):
        mine = files.get(r[0], set())
        return not any(files.get(q[0], set()) & mine for q in live[at[r[0]] + 1:])
    shapes = {"dropped": [], "regrouped": [], "merged": []}
    together, drop, alone = {}, set(), set()
    for k in range(0, len(pool), 8):
        run = pool[k:k + 8]
        if len(run) < 4:
            continue
        first = run[0]
        other = next((r for r in run[2:] if not subject_words(r[1]) & subject_words(first[1])
                      and movable(first, r)), None)
        if other is None:
            continue
        shapes["regrouped"].append((first[0], other[0]))
        together[first[0]] = (first, other, REGROUP_MESSAGE)
        alone.update((run[1][0], other[0]))
        rest = [r for r in run[2:] if r[0] not in alone]
        gone = next((r for r in rest if independent(r)), None)  # no later commit builds on it
        if gone is not None:
            drop.add(gone[0])
            shapes["dropped"].append(gone[0])
            rest = [r for r in rest if r is not gone]
        for a, b in zip(rest, rest[1:]):
            if at[b[0]] == at[a[0]] + 1:  # neighbours in the new stack: nothing it keeps sits between
                shapes["merged"].append((a[0], b[0]))
                together[a[0]] = (a, b, f"{a[1]}\n\n{b[1]}")
                alone.add(b[0])
                break
    units, placed = [], set()
    for r in live:
        if r[0] in drop or r[0] in placed:
            continue
        if r[0] in together:
            a, b, message = together[r[0]]
            units.append(([a, b], message))
            placed.update((a[0], b[0]))
        else:
            units.append(([r], ""))
            placed.add(r[0])
    return units, shapes


def realized(shapes: dict, made: dict, mine: list) -> dict:
    """The reshapes the replay made as planned: both commits of a pair in one new commit, and for a
    regroup a commit between them in a new commit of its own (else they would be neighbours)."""
    pos = {c[0]: k for k, c in enumerate(mine)}

    def apart(a, b):
        return any(made.get(c[0]) not in (None, made[a]) for c in mine[pos[a] + 1:pos[b]])

    together = {kind: [(a, b) for a, b in shapes[kind] if a in made and made.get(b) == made[a]]
                for kind in ("regrouped", "merged")}
    return {"dropped": list(shapes["dropped"]), "merged": together["merged"],
            "regrouped": [(a, b) for a, b in together["regrouped"] if apart(a, b)]}


# ------------------------------------------------------------------ scoring a report against the key

def score(data: dict, back: dict, key_pair: dict, key_absorbed: dict, judged=None, shapes=None) -> dict:
    """Counts of one report: ``back`` maps replayed commits to originals; ``key_pair``: old original
    -> new original it must share a row with; ``key_absorbed``: old original -> absorbing commit ("":
    any); ``judged``: the old originals the key can judge for absorption (None: all); ``shapes``: the
    fork-side reshapes (``reshape``), each read right when its commits' row has that status."""
    s = dict(pairs=0, pairs_found=0, paired=0, paired_right=0, absorbed_said=0, absorbed_right=0,
             absorbed_key=len(key_absorbed), absorbed_found=0, named=0, named_right=0, unjudged=0,
             unjudged_said=0, unjudged_partly=0)
    s["pairs"] = len(key_pair)
    shapes = shapes or {}
    row_of = {back.get(ref["commit"], ref["commit"]): row for row in data["mapping"] for ref in row["old"]}
    for kind in ("dropped", "regrouped", "merged"):
        found = shapes.get(kind, [])
        s[f"{kind}_key"] = len(found)
        s[f"{kind}_right"] = sum(
            1 for item in found
            if all(row_of.get(o, {}).get("status") == kind for o in ((item,) if kind == "dropped" else item))
            and (kind == "dropped" or row_of.get(item[0]) is row_of.get(item[1])))
    for row in data["mapping"]:
        news = {back.get(c["commit"], c["commit"]) for c in row["new"]}
        named = {row.get("upstream_commit", "")} | set(row.get("upstream_commits", []))
        for ref in row["old"]:
            o = back.get(ref["commit"], ref["commit"])
            if judged is not None and o not in judged and o not in key_absorbed:
                s["unjudged"] += 1
            if news:
                s["paired"] += 1
                s["paired_right"] += key_pair.get(o) in news
                s["pairs_found"] += key_pair.get(o) in news
            if row["status"] in ("absorbed", "likely-absorbed"):
                if judged is not None and o not in judged and o not in key_absorbed:
                    s["unjudged_said"] += 1
                    s["unjudged_partly"] += row.get("note", "").startswith("partially")
                    continue
                s["absorbed_said"] += 1
                if o in key_absorbed:
                    s["absorbed_right"] += 1
                    if key_absorbed[o]:
                        s["named"] += 1
                        s["named_right"] += key_absorbed[o] in named
            if o in key_absorbed and row["status"] in ("absorbed", "likely-absorbed"):
                s["absorbed_found"] += 1
    return s


def timed_report(*args) -> tuple:
    """``(report data, wall seconds, CPU seconds of this process and its git children)``: on a
    shared machine the wall time measures the neighbours too."""
    r0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    data = build_report(*args)
    wall = time.perf_counter() - t0
    r1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(getattr(b, f) - getattr(a, f) for a, b in ((r0, r1), (c0, c1)) for f in ("ru_utime", "ru_stime"))
    return data, wall, cpu


def _ratio(a, b) -> str:
    return f"{a}/{b} = {a / b:.1%}" if b else f"{a}/0"


def run_branch(repo: Path, mirror: Path, branch: str, work: Path) -> tuple:
    """The pick and bump scenarios of one branch: ``([(name, counts, seconds, sizes)], originals)``."""
    tip, main_tip = git(mirror, "rev-parse", f"refs/heads/{branch}", "refs/heads/main").split()
    base = git(repo, "merge-base", main_tip, tip).strip()
    mine = read_commits(repo, f"{base}..{tip}")
    when = git(repo, "log", "-1", "--format=%ct", tip).strip()
    new_base = git(repo, "rev-list", "-1", f"--before={when}", main_tip).strip()
    main = read_commits(repo, f"{base}..{new_base}")
    key = pick_key(mine, main)
    out = []
    b_tip, b_made, _ = replay(repo, base, mine, work)
    # pick: main originals (in main order) vs the branch's own commits, on the same base
    originals = [c for c in main if c[0] in set(key.values())]
    o_tip, o_made, _ = replay(repo, base, originals, work)
    back = {v: k for k, v in {**b_made, **o_made}.items()}
    key_pair = {orig: pick for pick, orig in key.items() if pick in b_made and orig in o_made}
    if key_pair:
        data, wall, cpu = timed_report(repo, base, o_tip, base, b_tip)
        out.append((f"{branch} pick", score(data, back, key_pair, {}), (wall, cpu),
                    (len(o_made), len(b_made))))
    # bump: the branch's commits onto main as it stood at the branch's last commit
    kept = [c for c in mine if c[0] in b_made and c[0] not in key]
    n_tip, n_made, there = replay(repo, new_base, kept, work)
    # the fork reshapes its new stack: drops, regroups, squashes (keyed only where they replayed)
    units, shapes = reshape(kept, n_made, whole(repo, n_made), files_of(repo, n_made))
    n_tip, n_made, _ = replay_units(repo, new_base, units, work)
    shapes = realized(shapes, n_made, mine)
    back = {v: k for k, v in b_made.items()}
    back.update({v: k for k, v in n_made.items()})
    back.update({n_made[a]: a for kind in ("regrouped", "merged") for a, _ in shapes[kind]})
    key_pair = {sha: back[n_made[sha]] for sha in n_made}
    # absorbed: a pick of a main commit in the range (named), or a change the new base has already
    key_absorbed = {sha: orig for sha, orig in key.items() if sha in b_made} | {sha: "" for sha in there}
    # the rest did not re-apply: the key cannot tell; a dropped commit is judged (never absorbed)
    judged = set(key_absorbed) | set(n_made) | set(shapes["dropped"])
    data, wall, cpu = timed_report(repo, base, b_tip, new_base, n_tip)
    out.append((f"{branch} bump", score(data, back, key_pair, key_absorbed, judged, shapes), (wall, cpu),
                (len(b_made), len(n_made))))
    return out, {sha for sha in b_made} | {sha for sha in o_made}


def mirror_path(given=None):
    """The mirror named by ``--mirror``, else by ``$MEGATRON_LM_MIRROR``, else None."""
    if given is not None:
        return Path(given)
    env = os.environ.get(MIRROR_ENV, "").strip()
    return Path(env) if env else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mirror", type=Path, default=None,
                    help=f"a bare clone or mirror of NVIDIA/Megatron-LM (default: ${MIRROR_ENV})")
    ap.add_argument("--branches", default=",".join(BRANCHES))
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    args = ap.parse_args(argv)
    mirror = mirror_path(args.mirror)
    if mirror is None:
        print(f"no Megatron-LM mirror: pass --mirror PATH or set {MIRROR_ENV} (a bare clone of NVIDIA/Megatron-LM)",
              file=sys.stderr)
        return 2
    if not (mirror / "objects").is_dir():
        print(f"--mirror {mirror}: not a bare git directory (no objects/ in it)", file=sys.stderr)
        return 2
    args.mirror = mirror
    work = args.work or Path(tempfile.mkdtemp(prefix="report-corpus-"))
    work.mkdir(parents=True, exist_ok=True)
    repo = scratch_repo(work, args.mirror)
    totals, used, timings = {}, set(), []
    try:
        for branch in args.branches.split(","):
            results, originals = run_branch(repo, args.mirror, branch, work)
            used |= originals
            for name, counts, seconds, sizes in results:
                timings.append((sum(sizes), seconds, name, sizes))
                for k, v in counts.items():
                    totals.setdefault(name.split()[1], {}).setdefault(k, 0)
                    totals[name.split()[1]][k] += v
                reshaped = "".join(f"  {kind} {counts[kind + '_right']}/{counts[kind + '_key']}"
                                   for kind in ("dropped", "regrouped", "merged") if counts[kind + "_key"])
                print(f"{name:26s} old {sizes[0]:4d} new {sizes[1]:4d}  pairs {_ratio(counts['pairs_found'], counts['pairs'])}"
                      f"  absorbed {counts['absorbed_right']}/{counts['absorbed_said']} said,"
                      f" {counts['absorbed_found']}/{counts['absorbed_key']} keyed{reshaped}"
                      f"  {seconds[0]:.2f} s ({seconds[1]:.2f} s CPU)", flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    both = {k: sum(t.get(k, 0) for t in totals.values()) for k in totals.get("bump", {})}
    print(f"\nupstream commits in the stacks: {len(used)}")
    print(f"pairing accuracy (key pairs on one row): {_ratio(both['pairs_found'], both['pairs'])}")
    print(f"pairing precision (old commits put with new ones, right partner): {_ratio(both['paired_right'], both['paired'])}")
    b = totals["bump"]
    print(f"absorption precision: {_ratio(b['absorbed_right'], b['absorbed_said'])}")
    print(f"absorption recall: {_ratio(b['absorbed_found'], b['absorbed_key'])}")
    print(f"absorbing commit named right (PR-keyed): {_ratio(b['named_right'], b['named'])}")
    for kind, what in (("dropped", "fork-side drops read dropped (never absorbed)"),
                       ("regrouped", "fork-side regroups read regrouped"), ("merged", "fork-side squashes read merged")):
        print(f"{what}: {_ratio(b[kind + '_right'], b[kind + '_key'])}")
    print(f"commits the key cannot judge (no PR link, did not re-apply onto the new base): {b['unjudged']};"
          f" the report calls {b['unjudged_said']} of them absorbed ({b['unjudged_partly']} partially)")
    size, (wall, cpu), name, sizes = max(timings)
    slow = max(timings, key=lambda t: t[1][0])
    print(f"largest range: {name} ({sizes[0]} old / {sizes[1]} new commits): report {wall:.2f} s ({cpu:.2f} s CPU)")
    print(f"slowest report: {slow[2]}: {slow[1][0]:.2f} s ({slow[1][1]:.2f} s CPU); load average {os.getloadavg()[0]:.1f}"
          f" on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
