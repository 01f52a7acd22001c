"""bench/rl_logprob_gap.py on a tiny MoE + MTP model on CPU: every setting is measured against the
float64 reference, the figures are finite and shaped as documented, and the fp32 options do not
widen the gap beyond bf16 rounding noise (the other bf16 roundings of the forward dominate)."""

import json
import math

import pytest

from bench import rl_logprob_gap

TINY = "--layers 1 --hidden 32 --ffn 48 --experts 4 --topk 2 --vocab 64 --seq 16 --batch 2 --batches 1"


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    out = tmp_path_factory.mktemp("gap") / "gap.json"
    printed = rl_logprob_gap.main(TINY.split() + ["--json", str(out)])
    assert json.loads(out.read_text()) == printed
    return printed


def test_every_setting_is_measured(figures):
    assert list(figures) == list(rl_logprob_gap.VARIANTS)
    for name, fig in figures.items():
        assert set(fig) == {"max", "mean"}, name
        assert all(math.isfinite(v) for v in fig.values()), name
        assert 0 < fig["mean"] <= fig["max"], name


def test_the_gap_is_bf16_sized(figures):
    """The reference holds the same weights: a gap at bf16 level, not a different model's."""
    assert figures["default"]["max"] < 0.1


def test_fp32_options_do_not_widen_the_gap(figures):
    default = figures["default"]
    for name, fig in figures.items():
        assert fig["mean"] <= 1.25 * default["mean"], name
        assert fig["max"] <= 1.5 * default["max"], name

