"""``list``: the README's patch table has one short row per patch (issue 47: the README must fit a
first visit), while the long Upstream-Status reason and the test ids stay in the patch file."""

import json

from tools.rebase.proof.listing import BEGIN, END, patch_table, update_readme
from tools.rebase.stack.series import load_stack
from tools.rebase.stack.state import current_digest
from tools.rebase.stack.workrepo import apply, export
from tests.tools.bumpkit import quiet

REASON = "a long reason " * 20


def _stack(fork):
    apply(fork.layout, log=quiet)
    fork.add_patch("alpha-seven", {"megatron/core/alpha.py": lambda t: t.replace("return 7", "return 70")},
                   tests="tests/test_a.py::test_one tests/test_a.py::test_two tests/test_b.py::test_three")
    export(fork.layout, log=quiet)
    patch = next(fork.layout.patches.glob("0001-*.patch"))
    text = patch.read_text().replace("Upstream-Status: fork-only test fixture", f"Upstream-Status: fork-only {REASON}")
    patch.write_text(text)
    return patch


def test_a_row_carries_the_status_keyword_and_the_proof_count_not_the_reason(fork):
    patch = _stack(fork)
    table = patch_table(fork.layout)
    row = next(line for line in table.splitlines() if "`alpha-seven`" in line)
    assert row.split(" | ")[2] == "fork-only"
    assert "long reason" not in table and "tests/test_a.py" not in table
    assert row.endswith("| not recorded |")
    _, patches = load_stack(fork.layout)
    record = {"stack_digest": current_digest(fork.layout, patches),
              "patches": [{"name": "alpha-seven", "verdict": "proven", "failed": 2, "tests": 3}]}
    (fork.layout.patches / "proof.json").write_text(json.dumps(record))
    row = next(line for line in patch_table(fork.layout).splitlines() if "`alpha-seven`" in line)
    assert row.endswith("| proven 2/3 |")
    assert REASON.strip() in patch.read_text()  # the reason is still where a maintainer reads it


def test_submitted_and_accepted_keep_their_reference(fork):
    patch = _stack(fork)
    patch.write_text(patch.read_text().replace(f"Upstream-Status: fork-only {REASON}",
                                               "Upstream-Status: accepted 0123abcd"))
    row = next(line for line in patch_table(fork.layout).splitlines() if "`alpha-seven`" in line)
    assert row.split(" | ")[2] == "accepted 0123abcd"


def test_update_readme_writes_the_short_table_between_the_markers(fork):
    _stack(fork)
    readme = fork.root / "README.md"
    readme.write_text(f"# fork\n\nbefore\n\n{BEGIN}\n{END}\n\nafter\n")
    assert update_readme(fork.layout) is True
    text = readme.read_text()
    assert text.startswith("# fork\n\nbefore\n\n") and text.endswith(f"{END}\n\nafter\n")
    assert "| # | Patch | Upstream | Proof |" in text
    assert update_readme(fork.layout) is False  # current: nothing written
