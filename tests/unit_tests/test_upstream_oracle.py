"""The upstream oracle itself: it imports pristine code, and it catches a fork-side deviation."""

from pathlib import Path

import pytest

from tests.unit_tests.upstream_oracle import ROOT

DENSE = {"scenario": "gpt", "config": {}}


def test_pristine_tree_is_the_unpatched_base(upstream_oracle):
    pristine = upstream_oracle.pristine / "megatron" / "core"
    ours = ROOT / "megatron" / "core"
    # A module the fork adds does not exist upstream; a file the fork patches differs.
    assert (ours / "memory_saver_hook_mode.py").is_file()
    assert not (pristine / "memory_saver_hook_mode.py").exists()
    config = "transformer/transformer_config.py"
    assert "post_mlp_layernorm" in (ours / config).read_text()
    assert "post_mlp_layernorm" not in (pristine / config).read_text()


@pytest.mark.slow
def test_each_side_imports_its_own_tree(upstream_oracle):
    (theirs,) = upstream_oracle.run("upstream", [DENSE])
    (ours,) = upstream_oracle.run("fork", [DENSE])
    assert Path(theirs["megatron_file"]).is_relative_to(upstream_oracle.pristine)
    assert Path(ours["megatron_file"]).resolve() == (ROOT / "megatron" / "core" / "__init__.py").resolve()


@pytest.mark.slow
def test_identical_code_paths_compare_equal(upstream_oracle):
    upstream, fork = upstream_oracle.compare([DENSE])
    assert upstream[0]["grads"], "the scenario must produce gradients to compare"
    assert all(g is not None for g in upstream[0]["grads"].values())


@pytest.mark.slow
def test_a_one_percent_fork_side_scaling_is_caught(upstream_oracle):
    with pytest.raises(AssertionError, match="outputs loss: values differ"):
        upstream_oracle.compare([DENSE], fork_mutation="scale_layer_output")


def test_a_given_pristine_tree_is_used_and_checked(monkeypatch, tmp_path):
    from tests.unit_tests import upstream_oracle

    monkeypatch.setenv("FORK_PRISTINE_TREE", str(tmp_path))
    with pytest.raises(ValueError, match=f"FORK_PRISTINE_TREE={tmp_path}: no megatron/core/__init__.py"):
        upstream_oracle.extract_pristine(tmp_path / "unused")
    (tmp_path / "megatron" / "core").mkdir(parents=True)
    (tmp_path / "megatron" / "core" / "__init__.py").write_text("")
    assert upstream_oracle.extract_pristine(tmp_path / "unused") == tmp_path
    assert not (tmp_path / "unused").exists()
