"""The bump journal's typed records (``Journal``, its ``Outcome`` and ``StopInfo`` entries, the
backup manifest ``Backup``): loading validates every field, so a damaged or hand-edited file is an
error naming the field, never read as "no bump". The files themselves are in ``journal.py``."""

import json
from dataclasses import MISSING, asdict, dataclass, field, fields

from tools.rebase.errors import RebaseError

JOURNAL_VERSION = 2
PHASES = ("replaying", "stopped", "testing", "tests-failed", "finishing")
OUTCOMES = ("clean", "resolved-recorded", "resolved-manual", "absorbed", "dropped")
STOP_KINDS = ("conflict", "lint")


class CorruptJournal(RebaseError):
    """journal.json (or the backup manifest) cannot be read back as written."""



def _check(cond: bool, what: str) -> None:
    if not cond:
        raise ValueError(what)


def _is_str_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_sha(value) -> bool:
    return isinstance(value, str) and len(value) == 40 and all(c in "0123456789abcdef" for c in value)


def _build(cls, data, where: str):
    """``cls(**data)`` with exactly the declared fields (then ``cls.validate``)."""
    _check(isinstance(data, dict), f"{where} is not an object")
    names = {f.name for f in fields(cls)}
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    missing, unknown = sorted(required - set(data)), sorted(set(data) - names)
    _check(not missing, f"{where} lacks {', '.join(missing)}")
    _check(not unknown, f"{where} has unknown field(s) {', '.join(unknown)}")
    record = cls(**data)
    record.validate(where)
    return record


@dataclass
class Outcome:
    """What happened to one patch of the old stack."""

    index: int
    name: str
    old: str
    new: str | None
    outcome: str
    upstream: str = ""
    how: str = ""
    note: str = ""

    def validate(self, where: str) -> None:
        _check(isinstance(self.index, int) and self.index >= 0, f"{where}.index is not a patch index")
        _check(isinstance(self.name, str) and _is_sha(self.old), f"{where} does not name its old commit")
        _check(self.new is None or _is_sha(self.new), f"{where}.new is not a commit id")
        _check(self.outcome in OUTCOMES, f"{where}.outcome {self.outcome!r} is not one of {', '.join(OUTCOMES)}")
        _check(all(isinstance(v, str) for v in (self.upstream, self.how, self.note)),
               f"{where}: upstream/how/note must be text")


def _is_dict_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def _check_analysis(a, where: str) -> None:
    """The shape ``conflicts.analyse`` returns and the stop message and forecast read."""
    _check(isinstance(a, dict), f"{where} is not an object")
    for key, kind in (("types", dict), ("files", dict), ("causes", list), ("also", list)):
        _check(isinstance(a.get(key), kind), f"{where}.{key} is missing or not a{'n object' if kind is dict else ' list'}")
    _check(all(isinstance(k, str) and isinstance(v, str) for k, v in a["types"].items()),
           f"{where}.types must map files to conflict types")
    _check(all(isinstance(v, dict) and isinstance(v.get("type"), str) for v in a["files"].values()),
           f"{where}.files must map files to objects with a type")
    for key in ("causes", "also"):
        _check(_is_dict_list(a[key]) and all(_is_sha(c.get("commit")) and isinstance(c.get("subject"), str)
                                              for c in a[key]),
               f"{where}.{key} must be a list of upstream commits with subjects")
    for key in ("stack_context", "old_context"):
        _check(key not in a or (_is_str_list(a[key]) and all(map(_is_sha, a[key]))),
               f"{where}.{key} must be a list of commit ids")


@dataclass
class StopInfo:
    """Where the bump waits for the maintainer: a conflicting patch (``kind`` "conflict", with the
    ``conflicts.analyse`` result) or a clean merge that broke a Python file ("lint"). ``findings``
    are the post-merge lint's (``lint.Finding.to_json``). Journals written before these fields
    existed load with the defaults."""

    index: int
    files: list
    rerere_ids: list
    upstream: list
    kind: str = "conflict"
    analysis: dict | None = None
    findings: list = field(default_factory=list)
    merged: dict = field(default_factory=dict)  # path -> blob git merged it to without a conflict

    def validate(self, where: str) -> None:
        _check(isinstance(self.index, int) and self.index >= 0, f"{where}.index is not a patch index")
        _check(_is_str_list(self.files) and _is_str_list(self.rerere_ids), f"{where}: files/rerere_ids must be text lists")
        _check(_is_dict_list(self.upstream), f"{where}.upstream must be a list of objects")
        _check(self.kind in STOP_KINDS, f"{where}.kind {self.kind!r} is not one of {', '.join(STOP_KINDS)}")
        if self.analysis is not None:
            _check_analysis(self.analysis, f"{where}.analysis")
        _check(_is_dict_list(self.findings) and all(isinstance(f.get("message"), str) for f in self.findings),
               f"{where}.findings must be a list of lint findings (objects with a message)")
        _check(isinstance(self.merged, dict) and all(isinstance(p, str) and _is_sha(b)
                                                     for p, b in self.merged.items()),
               f"{where}.merged must map paths to blob ids")
        _check(self.kind != "lint" or (self.findings and self.analysis is None),
               f"{where}: a lint stop carries its findings and no conflict analysis")


@dataclass
class Journal:
    """A bump in progress (``journal.json``)."""

    onto: str
    phase: str
    old_pin: str  # upstream.toml text
    new_pin: str
    old_base: str
    old_tip: str
    old_head: str
    commits: list  # the old stack's commits, in order
    names: list  # their Patch-Names
    dates: list  # their raw author dates
    next: int = 0  # index of the first patch not replayed yet
    tip: str | None = None  # the new stack so far (None until the new base is imported)
    new_base: str | None = None
    outcomes: list = field(default_factory=list)  # [Outcome]
    stopped: StopInfo | None = None
    picking: StopInfo | None = None  # a patch rerere resolved, being committed (not yet recorded)
    materialized: bool = False  # megatron/ was rewritten for the tests
    tests: dict = field(default_factory=dict)  # Patch-Name -> {node id: result}
    resolutions_from: str = ""  # the line whose recorded resolutions were loaded too (bump --resolutions-from)
    # The options the bump was started with, kept for `bump --continue` (which takes none of them
    # again): run the Tests: (off with --no-tests, at the start or at any --continue), the local
    # mirror of the new base's URL, the finishing gate's parallel test runs.
    run_tests: bool = True
    mirror: str = ""
    jobs: int = 1
    version: int = JOURNAL_VERSION

    def validate(self, where: str = "journal") -> None:
        _check(self.version == JOURNAL_VERSION, f"version {self.version!r} is not {JOURNAL_VERSION}")
        _check(isinstance(self.onto, str) and self.onto, "onto is empty")
        _check(self.phase in PHASES, f"phase {self.phase!r} is not one of {', '.join(PHASES)}")
        _check(isinstance(self.old_pin, str) and isinstance(self.new_pin, str), "the pins must be text")
        for name in ("old_base", "old_tip", "old_head"):
            _check(_is_sha(getattr(self, name)), f"{name} is not a commit id")
        for name in ("tip", "new_base"):
            _check(getattr(self, name) is None or _is_sha(getattr(self, name)), f"{name} is not a commit id")
        _check(_is_str_list(self.commits) and all(map(_is_sha, self.commits)), "commits is not a list of commit ids")
        _check(_is_str_list(self.names) and _is_str_list(self.dates), "names/dates must be text lists")
        _check(len(self.names) == len(self.commits) == len(self.dates), "commits, names and dates differ in length")
        _check(isinstance(self.next, int) and 0 <= self.next <= len(self.commits), f"next {self.next!r} is out of range")
        _check((self.tip is None) == (self.new_base is None), "tip and new_base must be set together")
        _check(isinstance(self.outcomes, list) and all(isinstance(o, Outcome) for o in self.outcomes),
               "outcomes is not a list of outcomes")
        _check(all(o.index < len(self.commits) for o in self.outcomes), "an outcome names a patch out of range")
        _check((self.stopped is not None) == (self.phase == "stopped"), "stopped does not match the phase")
        for name in ("stopped", "picking"):
            value = getattr(self, name)
            _check(value is None or (isinstance(value, StopInfo) and value.index < len(self.commits)),
                   f"{name} names no patch of the stack")
        _check(isinstance(self.materialized, bool), "materialized is not true/false")
        _check(isinstance(self.resolutions_from, str), "resolutions_from is not a line name")
        _check(isinstance(self.run_tests, bool), "run_tests is not true/false")
        _check(isinstance(self.mirror, str), "mirror is not a path")
        _check(isinstance(self.jobs, int) and not isinstance(self.jobs, bool) and self.jobs >= 1,
               "jobs is not a count >= 1")
        _check(isinstance(self.tests, dict) and all(isinstance(v, dict) for v in self.tests.values()),
               "tests is not a map of patch names to results")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Journal":
        data = json.loads(text)
        _check(isinstance(data, dict), "not a JSON object")
        _check(data.get("version") == JOURNAL_VERSION,
               f"version {data.get('version')!r} is not {JOURNAL_VERSION} (another version of the tool wrote it)")
        data = dict(data)
        if isinstance(data.get("outcomes"), list):
            data["outcomes"] = [_build(Outcome, o, f"outcomes[{k}]") for k, o in enumerate(data["outcomes"])]
        for name in ("stopped", "picking"):
            if data.get(name) is not None:
                data[name] = _build(StopInfo, data[name], name)
        return _build(cls, data, "journal")


@dataclass
class Backup:
    """What ``begin`` saved (``backup/backup.json``): enough for ``restore`` without the journal."""

    present: list  # names under backup/ that existed live
    work_refs: dict
    work_head_ref: str
    work_head: str
    version: int = JOURNAL_VERSION

    def validate(self, where: str = "backup") -> None:
        _check(self.version == JOURNAL_VERSION, f"version {self.version!r} is not {JOURNAL_VERSION}")
        _check(_is_str_list(self.present), "present is not a list of names")
        _check(isinstance(self.work_refs, dict) and all(map(_is_sha, self.work_refs.values())),
               "work_refs is not a map of refs to commit ids")
        _check(isinstance(self.work_head_ref, str) and _is_sha(self.work_head), "work HEAD is not recorded")


