"""``tree``: variants of the stack materialized in a directory of their own (a prefix of the
series, the stack without a patch, both), the later patches that stop applying named, and
nothing of the checkout written."""

import pytest

from tools.rebase.cli import main
from tools.rebase.errors import RebaseError
from tools.rebase.proof.variant import build_variant


def three_patches(fork):
    fork.stack([
        ("alpha-seventy", {"megatron/core/alpha.py": lambda t: t.replace("return 7\n", "return 70\n")}),
        ("beta-extra", {"megatron/core/beta.py": lambda t: t + "BETA_EXTRA = 'x'\n"}),
        ("beta-extra-y", {"megatron/core/beta.py": lambda t: t.replace("BETA_EXTRA = 'x'", "BETA_EXTRA = 'y'")}),
    ])  # fmt: skip


def read(tree, name):
    return (tree / "megatron" / "core" / name).read_text()


def test_prefix_of_the_series(fork, tmp_path):
    three_patches(fork)
    v = build_variant(fork.layout, tmp_path / "v", upto="0001")
    assert v.kept == ["alpha-seventy"] and v.left_out == [] and v.not_applying == []
    assert "return 70\n" in read(tmp_path / "v", "alpha.py")
    assert "BETA_EXTRA" not in read(tmp_path / "v", "beta.py")
    assert read(tmp_path / "v", "package_info.py").rstrip().endswith("__version__ = '0.42.1+rl.1.variant'")


def test_without_a_patch_names_the_later_ones_that_stop_applying(fork, tmp_path):
    three_patches(fork)
    v = build_variant(fork.layout, tmp_path / "v", without=["beta-extra"])
    assert v.kept == ["alpha-seventy"]
    assert v.left_out == ["beta-extra"] and v.not_applying == ["beta-extra-y"]
    assert "BETA_EXTRA" not in read(tmp_path / "v", "beta.py")
    w = build_variant(fork.layout, tmp_path / "w", without=["1"])  # by number, as prove
    assert w.kept == ["beta-extra", "beta-extra-y"] and "BETA_EXTRA = 'y'" in read(tmp_path / "w", "beta.py")
    assert "return 70\n" not in read(tmp_path / "w", "alpha.py")


def test_writes_nothing_of_the_checkout_and_never_into_a_used_directory(fork, tmp_path):
    three_patches(fork)
    before = fork.snapshot()
    package = {p: p.read_bytes() for p in sorted(fork.layout.package.rglob("*")) if p.is_file()}
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("a maintainer's file\n")
    with pytest.raises(RebaseError, match="must be a new or empty directory"):
        build_variant(fork.layout, used, upto="0002")
    assert sorted(p.name for p in used.iterdir()) == ["notes.txt"]
    build_variant(fork.layout, tmp_path / "v", upto="0002")
    assert fork.snapshot() == before
    assert {p: p.read_bytes() for p in sorted(fork.layout.package.rglob("*")) if p.is_file()} == package


def test_bad_names_are_clear_errors(fork, tmp_path):
    three_patches(fork)
    with pytest.raises(RebaseError, match="tree: no patch in the series is named 'nosuch'"):
        build_variant(fork.layout, tmp_path / "v", without=["nosuch"])
    with pytest.raises(RebaseError, match="after --upto 0001"):
        build_variant(fork.layout, tmp_path / "v", upto="0001", without=["0003"])
    assert not (tmp_path / "v").exists()
    for generated in (fork.layout.package / "variant", fork.layout.state_dir / "variant"):
        with pytest.raises(RebaseError, match="which the tool generates"):
            build_variant(fork.layout, generated)
        assert not generated.exists()


def test_cli(fork, tmp_path, capsys):
    three_patches(fork)
    out = tmp_path / "cli"
    assert main(["-C", str(fork.root), "tree", str(out), "--without", "0002"]) == 0
    said = capsys.readouterr().out
    assert "left out: beta-extra" in said and "also left out: beta-extra-y" in said
    assert main(["-C", str(fork.root), "tree", str(out)]) == 2  # not empty any more
    assert "must be a new or empty directory" in capsys.readouterr().err
