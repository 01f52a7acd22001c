"""bench/rl_logprob_gap.py on a tiny MoE + MTP model on CPU: every setting is measured against the
float64 reference, the figures are finite and shaped as documented, and the fp32 options do not
widen the gap beyond bf16 rounding noise (the other bf16 roundings of the forward dominate)."""

import json
import math

import pytest
import torch

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



class _TENormStandIn(torch.nn.LayerNorm):
    """Transformer Engine's norm as the bench meets it where TE is installed: the block's final
    norm (``transformer_block.LayerNormImpl`` is ``TENorm`` then), an ``_extra_state`` entry in the
    state dict, and no float64 kernel (TE's fused LayerNorm op raises ``KeyError: torch.float64``)."""

    def __init__(self, config, hidden_size, eps=1e-5, **_):
        super().__init__(hidden_size, eps=eps)

    def forward(self, x):
        if x.dtype == torch.float64:
            raise KeyError(torch.float64)
        return super().forward(x)

    def get_extra_state(self):
        return torch.zeros(1)

    def set_extra_state(self, state):
        pass


_TENormStandIn.__module__ = "megatron.core.extensions.transformer_engine"


@pytest.fixture
def te_norm_installed(monkeypatch):
    from megatron.core.extensions import transformer_engine
    from megatron.core.transformer import transformer_block

    monkeypatch.setattr(transformer_engine, "TENorm", _TENormStandIn)
    monkeypatch.setattr(transformer_block, "LayerNormImpl", _TENormStandIn)


def test_float64_reference_uses_torch_norms_where_te_norm_is_the_default(te_norm_installed):
    from megatron.core import cpu_harness

    args = rl_logprob_gap.parse_args(TINY.split() + ["--variants", "default"])
    with cpu_harness.single_process(seed=args.seed):
        bf16 = rl_logprob_gap._model(args, torch.bfloat16, {})
        reference = rl_logprob_gap._model(args, torch.float64, {"moe_router_dtype": "fp64"})
        figures = rl_logprob_gap.measure(args)
    # The stand-in is in effect: the bf16 model takes it as its final norm ...
    assert isinstance(bf16.decoder.final_layernorm, _TENormStandIn)
    assert rl_logprob_gap.te_modules(bf16)
    # ... and the reference never does.
    assert rl_logprob_gap.te_modules(reference) == []
    norms = [m for m in reference.modules() if "norm" in type(m).__name__.lower()]
    assert norms and all(type(m) in (torch.nn.LayerNorm, torch.nn.RMSNorm) for m in norms), norms
    assert math.isfinite(figures["default"]["max"]) and figures["default"]["max"] < 0.1


def test_reference_load_names_what_does_not_match():
    ref = torch.nn.Linear(2, 2)
    weights = {"weight": torch.zeros(2, 2), "scale": torch.zeros(1)}
    with pytest.raises(RuntimeError, match=r"missing from the bf16 state dict \['bias'\].*\['scale'\]"):
        rl_logprob_gap._load_into_reference(ref, weights)
