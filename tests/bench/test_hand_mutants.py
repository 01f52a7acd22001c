"""``bench/hand_mutants.py``: its data file is checked before any tree is built, and a patch's
score counts killed mutants over the non-equivalent ones."""

import pytest

from bench import hand_mutants

ENTRY = 'patch = "0036"\nid = "{id}"\nfile = "{file}"\nold = "a"\nnew = "{new}"\nwhy = "w"\n'


def _write(tmp_path, *entries):
    path = tmp_path / "hand.toml"
    path.write_text("".join("[[mutant]]\n" + e for e in entries))
    return path


def test_the_project_data_file_loads_with_unique_ids_and_five_per_patch_of_0036_to_0046():
    mutants = hand_mutants.load_mutants(hand_mutants.ROOT / "bench" / "mutants" / "hand.toml")
    per_patch = {}
    for mutant in mutants:
        per_patch[mutant["patch"]] = per_patch.get(mutant["patch"], 0) + 1
    assert all(per_patch.get(f"00{n}", 0) >= 5 for n in range(36, 47)), per_patch


@pytest.mark.parametrize(
    "entries, message",
    [
        ([ENTRY.format(id="x", file="megatron/a.py", new="b"),
          ENTRY.format(id="x", file="megatron/a.py", new="c")], "the id is used twice"),
        ([ENTRY.format(id="x", file="megatron/a.py", new="a")], "old and new text are the same"),
        ([ENTRY.format(id="x", file="tools/a.py", new="b")], "must be a path under megatron/"),
        ([ENTRY.format(id="x", file="megatron/../a.py", new="b")], "must be a path under megatron/"),
        (['patch = "0036"\nid = "x"\n'], "missing ['file', 'new', 'old', 'why']"),
    ],
)
def test_bad_entries_are_refused_by_name(tmp_path, entries, message):
    with pytest.raises(SystemExit, match=message.replace("[", r"\[").replace("]", r"\]")):
        hand_mutants.load_mutants(_write(tmp_path, *entries))


def test_score_leaves_equivalent_mutants_out():
    results = [
        {"patch": "0036", "verdict": "killed"},
        {"patch": "0036", "verdict": "killed"},
        {"patch": "0036", "verdict": "survived"},
        {"patch": "0036", "verdict": "equivalent"},
        {"patch": "0041", "verdict": "equivalent"},
    ]
    assert hand_mutants.summary(results) == [
        "0036: 2/3 killed (67%), 1 equivalent",
        "0041: 0/0 killed (100%), 1 equivalent",
    ]
