"""The mutant generator of ``prove --mutants``: which mutants a patch's added lines give, in a
reproducible sample, applied to the patched file, and the equivalents sidecar."""

import pytest

from tools.rebase.proof.mutants import (
    Mutant,
    added_lines,
    apply_mutant,
    code_lines,
    in_code,
    load_equivalents,
    mutants_of_line,
    mutants_of_patch,
    sample,
    sample_where,
    score,
)

PATCH = '''\
diff --git a/megatron/core/x.py b/megatron/core/x.py
--- a/megatron/core/x.py
+++ b/megatron/core/x.py
@@ -10,3 +10,7 @@ def f(a, b):
     keep = 1
+    if a < 3 and not b:
+        return a.detach()
+    # a comment == not touched
     other = 2
+    value = "x == y"
diff --git a/docs/readme.md b/docs/readme.md
--- a/docs/readme.md
+++ b/docs/readme.md
@@ -1,1 +1,2 @@
 text
+more == text
'''


def _ops(line):
    return [(m.operator, m.mutated) for m in mutants_of_line("megatron/x.py", 1, line)]


def test_added_lines_carry_the_new_file_numbers_and_skip_non_python():
    assert added_lines(PATCH) == [
        ("megatron/core/x.py", 11, "    if a < 3 and not b:"),
        ("megatron/core/x.py", 12, "        return a.detach()"),
        ("megatron/core/x.py", 13, "    # a comment == not touched"),
        ("megatron/core/x.py", 15, '    value = "x == y"'),
    ]


def test_operators_on_one_line():
    assert _ops("    if a < 3 and not b:") == [
        ("flip comparison", "    if a >= 3 and not b:"),
        ("change constant", "    if a < 4 and not b:"),
        ("and/or", "    if a < 3 or not b:"),
        ("drop not", "    if a < 3 and b:"),
    ]
    assert _ops("        return a.detach()") == [
        ("drop detach", "        return a"),
        ("delete statement", "        pass"),
    ]
    assert _ops("    x = y is not None") == [
        ("drop not", "    x = y is None"),
        ("delete statement", "    pass"),
    ]
    assert ("drop not", "    ok = k in d") in _ops("    ok = k not in d")
    assert ("change constant", "    flag = False") in _ops("    flag = True")


def test_strings_comments_and_open_brackets_are_left_alone():
    assert _ops("    # a == b") == []
    assert _ops('    msg = "a == b"') == [("delete statement", "    pass")]
    opened = _ops("    call(a == b,")
    assert opened == [("flip comparison", "    call(a != b,")], "no deletion of half a statement"
    assert _ops("    else:") == [] and _ops("    )") == []


def test_patch_mutants_and_seeded_sample_are_reproducible():
    mutants = mutants_of_patch(PATCH)
    assert {m.path for m in mutants} == {"megatron/core/x.py"}
    assert len(mutants) == 7
    first, again = sample(mutants, 3, seed=7), sample(mutants, 3, seed=7)
    assert first == again and len(first) == 3
    assert [mutants.index(m) for m in first] == sorted(mutants.index(m) for m in first)
    assert any(sample(mutants, 3, seed=s) != first for s in range(1, 20))
    assert sample(mutants, 99) == mutants
    with pytest.raises(ValueError, match="must be >= 0"):
        sample(mutants, -1)


def test_ids_do_not_depend_on_the_line_number():
    a = Mutant("megatron/x.py", 3, "    y = 1", "    y = 2", "change constant")
    b = Mutant("megatron/x.py", 30, "        y = 1", "        y = 2", "change constant")
    assert a.id == b.id and len(a.id) == 12
    assert a.id != Mutant("megatron/z.py", 3, "    y = 1", "    y = 2", "change constant").id


def test_apply_replaces_exactly_that_line_or_refuses():
    text = "a = 1\nif a < 3:\n    pass\n"
    (m,) = [m for m in mutants_of_line("megatron/x.py", 2, "if a < 3:") if m.operator == "flip comparison"]
    assert apply_mutant(text, m) == "a = 1\nif a >= 3:\n    pass\n"
    with pytest.raises(ValueError, match="line 2 of megatron/x.py is not 'if a < 3:'"):
        apply_mutant("a = 1\nif a < 4:\n", m)


def test_equivalents_need_an_id_and_a_reason():
    assert load_equivalents('[[equivalent]]\nid = "0123456789ab"\nreason = "same value"\n') == {
        "0123456789ab": "same value"}
    with pytest.raises(ValueError, match=r"equivalent\[0\] \(0123456789ab\): a reason is required"):
        load_equivalents('[[equivalent]]\nid = "0123456789ab"\nreason = " "\n')
    with pytest.raises(ValueError, match="id must be a 12-digit hex mutant id"):
        load_equivalents('[[equivalent]]\nid = "zz"\nreason = "r"\n')
    with pytest.raises(ValueError, match="not valid TOML"):
        load_equivalents("[[equivalent\n")


def test_score_counts_only_non_equivalent_mutants():
    assert score(19, 1) == 0.95 and score(0, 0) == 1.0


def test_lines_inside_a_docstring_are_not_code():
    text = 'def f(x):\n    """Doc\n    x == 1 is prose\n    """\n    return x == 1  # note\n'
    assert code_lines(text) == {1, 5}
    prose = Mutant("megatron/x.py", 3, "    x == 1 is prose", "    x != 1 is prose", "flip comparison")
    code = Mutant("megatron/x.py", 5, "    return x == 1  # note", "    return x != 1  # note",
                  "flip comparison")
    assert in_code([prose, code], {"megatron/x.py": text}) == [code]
    assert code_lines("def f(:\n") is None


def test_sample_where_fills_the_sample_with_mutants_that_pass_the_check():
    mutants = mutants_of_patch(PATCH)
    tried = []

    def keep(m):
        tried.append(m)
        return m.operator != "delete statement"

    chosen, rejected = sample_where(mutants, 3, 7, keep)
    assert len(chosen) == 3 and all(m.operator != "delete statement" for m in chosen)
    assert [mutants.index(m) for m in chosen] == sorted(mutants.index(m) for m in chosen)
    assert rejected == len(tried) - 3, "it stops trying once the sample is full"
    assert sample_where(mutants, 3, 7, keep)[0] == chosen, "seeded: the same sample again"
    everything, rejected = sample_where(mutants, 99, 0, keep)
    assert len(everything) + rejected == len(mutants)
    with pytest.raises(ValueError, match="must be >= 0"):
        sample_where(mutants, -1, 0, keep)
