"""TE linear parameters carry Megatron's parallel_mode (patch te-linear-parallel-mode-tags).

Without Transformer Engine, megatron.core.extensions.transformer_engine defines TELinear on a
MagicMock, so its __init__ never runs. The stand-in tests load the real module source a second
time, under a private name, with a minimal fake ``transformer_engine`` whose ``pytorch.Linear``
is a small real nn.Module; the real TELinear / TEColumnParallelLinear / TERowParallelLinear
constructors (and their tagging code) then run on CPU.
"""

import importlib.util
import sys
from unittest.mock import MagicMock

import pytest
import torch
from packaging.version import Version

import megatron.core.utils as mcore_utils
from megatron.core.transformer import TransformerConfig
from tests.unit_tests.test_utilities import Utils

TE_EXTENSION = "megatron.core.extensions.transformer_engine"


class StandInTELinear(torch.nn.Module):
    """The part of te.pytorch.Linear that TELinear.__init__ relies on: sharded parameters."""

    def __init__(
        self,
        in_features,
        out_features,
        *,
        bias=True,
        parallel_mode=None,
        tp_size=1,
        params_dtype=torch.float32,
        init_method=None,
        **kwargs,
    ):
        super().__init__()
        if parallel_mode == "column":
            out_features //= tp_size
        elif parallel_mode == "row":
            in_features //= tp_size
        self.parallel_mode = parallel_mode  # TE's own (communication) mode
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=params_dtype))
        if init_method is not None:
            init_method(self.weight)
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=params_dtype))
        else:
            self.register_parameter("bias", None)


class StandInTELayerNormLinear(StandInTELinear):
    """te.pytorch.LayerNormLinear as TELayerNormColumnParallelLinear sees it: a norm fused in
    front of a column-sharded linear, with TE's parameter names for the norm."""

    def __init__(self, in_features, out_features, **kwargs):
        super().__init__(in_features, out_features, **kwargs)
        dtype = kwargs.get("params_dtype", torch.float32)
        self.layer_norm_weight = torch.nn.Parameter(torch.ones(in_features, dtype=dtype))
        self.layer_norm_bias = torch.nn.Parameter(torch.zeros(in_features, dtype=dtype))


class StandInTEGroupedLinear(torch.nn.Module):
    """te.pytorch.GroupedLinear as TEGroupedLinear.__init__ sees it: one numbered weight (and
    bias) per local expert. Megatron hands it parallel_mode=None when it does the expert
    communication itself, which is how the MoE layers build it."""

    def __init__(self, num_gemms, in_features, out_features, *, bias=True, parallel_mode=None,
                 params_dtype=torch.float32, init_method=None, **kwargs):
        super().__init__()
        self.parallel_mode = parallel_mode
        self.num_gemms = num_gemms
        for i in range(num_gemms):
            weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=params_dtype))
            if init_method is not None:
                init_method(weight)
            self.register_parameter(f"weight{i}", weight)
            if bias:
                self.register_parameter(
                    f"bias{i}", torch.nn.Parameter(torch.zeros(out_features, dtype=params_dtype))
                )


def load_extension_on_fake_te(monkeypatch, version):
    """Load the real extension module's source under a private name, on a fake TE of ``version``."""
    fake_te = MagicMock(name="transformer_engine")
    fake_te.__version__ = version
    fake_te.pytorch.Linear = StandInTELinear
    fake_te.pytorch.LayerNormLinear = StandInTELayerNormLinear
    fake_te.pytorch.GroupedLinear = StandInTEGroupedLinear
    monkeypatch.setitem(sys.modules, "transformer_engine", fake_te)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", fake_te.pytorch)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch.fp8", fake_te.pytorch.fp8)
    # Keep the process-wide TE version cache consistent and restore it afterwards.
    monkeypatch.setattr(mcore_utils, "_te_version", Version(version))
    origin = importlib.util.find_spec(TE_EXTENSION).origin
    name = "_te_extension_with_stand_in_te"
    spec = importlib.util.spec_from_file_location(name, origin)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    assert module.HAVE_TE and issubclass(module.TELinear, StandInTELinear)
    assert issubclass(module.TELayerNormColumnParallelLinear, StandInTELayerNormLinear)
    return module


@pytest.fixture
def te_ext(monkeypatch):
    """The real transformer_engine extension module, built on a fake TE package."""
    return load_extension_on_fake_te(monkeypatch, "0.0.0")


@pytest.fixture
def te_ext_grouped(monkeypatch):
    """The same on a fake TE new enough (1.9) that the module defines its grouped linears, and
    old enough that none of the optional 2.x paths of their constructors run."""
    module = load_extension_on_fake_te(monkeypatch, "1.9.0")
    assert issubclass(module.TEColumnParallelGroupedLinear, StandInTEGroupedLinear)
    return module


def tiny_config(**overrides):
    values = dict(
        num_layers=1,
        hidden_size=32,
        num_attention_heads=4,
        use_cpu_initialization=True,
        bf16=False,
        params_dtype=torch.float32,
    )
    values.update(overrides)
    return TransformerConfig(**values)


def build(te_ext, kind, config, is_expert=False, bias=True):
    common = dict(
        config=config,
        init_method=torch.nn.init.normal_,
        bias=bias,
        skip_bias_add=True,
        is_expert=is_expert,
    )
    if kind == "column":
        return te_ext.TEColumnParallelLinear(32, 16, gather_output=False, **common)
    if kind == "row":
        return te_ext.TERowParallelLinear(32, 16, input_is_parallel=True, **common)
    return te_ext.TELinear(
        32, 16, parallel_mode=kind, skip_weight_param_allocation=False, tp_group=None, **common
    )


def build_layernorm_column(te_ext, config, bias):
    """QKV / fc1 of the TE spec: a norm fused in front of a column-sharded linear."""
    return te_ext.TELayerNormColumnParallelLinear(
        32,
        48,
        config=config,
        init_method=torch.nn.init.normal_,
        gather_output=False,
        bias=bias,
        skip_bias_add=False,
        is_expert=False,
    )


def layernorm_column_tags(bias):
    """The linear part is column-sharded; the fused norm is the same on every tensor-parallel rank."""
    expected = {"weight": "column", "layer_norm_weight": "duplicated", "layer_norm_bias": "duplicated"}
    if bias:
        expected["bias"] = "column"
    return expected


def tags(module):
    return {name: getattr(p, "parallel_mode", "<missing>") for name, p in module.named_parameters()}


class TestTELinearParallelModeTagsStandIn:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.parametrize("kind", ["column", "row", "duplicated"])
    @pytest.mark.parametrize("cpu_init", [True, False])
    def test_non_expert_modes(self, te_ext, kind, cpu_init):
        layer = build(te_ext, kind, tiny_config(use_cpu_initialization=cpu_init))
        assert set(tags(layer)) == {"weight", "bias"}
        assert tags(layer) == {"weight": kind, "bias": kind}

    def test_duplicated_is_not_recoverable_from_the_module(self, te_ext):
        layer = build(te_ext, "duplicated", tiny_config())
        assert layer.parallel_mode is None  # TE's mode: no communication
        assert layer.weight.parallel_mode == "duplicated"
        assert layer.weight.tensor_model_parallel is False

    @pytest.mark.parametrize("kind", ["column", "row"])
    @pytest.mark.parametrize("bias", [True, False])
    def test_expert_modes(self, te_ext, kind, bias):
        layer = build(te_ext, kind, tiny_config(), is_expert=True, bias=bias)
        expected = {"weight": kind, "bias": kind} if bias else {"weight": kind}
        assert tags(layer) == expected
        # The expert branch still sets its usual attributes alongside the tag: allreduce (False
        # selects the expert data-parallel group) on every base ...
        assert all(isinstance(getattr(p, "allreduce", None), bool) for p in layer.parameters())
        # ... and, where the base marks expert weights as tensor-parallel shards through its
        # helper (0.19.2's _set_expert_parameter_attributes), that mark too. Upstream dev's
        # TELinear sets only allreduce on expert parameters, so there is no mark to keep.
        if hasattr(te_ext, "_set_expert_parameter_attributes"):
            assert layer.weight.tensor_model_parallel is True

    @pytest.mark.parametrize("cpu_init", [True, False])
    @pytest.mark.parametrize("bias", [True, False])
    def test_layernorm_column_parallel_linear(self, te_ext, cpu_init, bias):
        """QKV and fc1 of the TE spec: the linear part is column-sharded, the fused norm is
        the same on every tensor-parallel rank."""
        config = tiny_config(use_cpu_initialization=cpu_init)
        layer = build_layernorm_column(te_ext, config, bias=bias)
        assert tags(layer) == layernorm_column_tags(bias)

    def test_expert_helper_tags_numbered_grouped_parameters(self, te_ext):
        if not hasattr(te_ext, "_set_expert_parameter_attributes"):
            pytest.skip(
                "this base has no _set_expert_parameter_attributes (upstream dev sets expert "
                "attributes inline in TELinear and TEGroupedLinear); grouped linears are checked "
                "with real Transformer Engine in TestTELinearParallelModeTagsRealTE"
            )
        module = torch.nn.Module()
        for i in range(2):
            module.register_parameter(f"weight{i}", torch.nn.Parameter(torch.zeros(2, 2)))
            module.register_parameter(f"bias{i}", torch.nn.Parameter(torch.zeros(2)))
        te_ext._set_expert_parameter_attributes(module, "row", use_expert_pgs=True)
        assert set(tags(module).values()) == {"row"}
        assert len(tags(module)) == 4

    @pytest.mark.parametrize("kind", ["column", "row"])
    @pytest.mark.parametrize("bias", [True, False])
    def test_grouped_linear_modes(self, te_ext_grouped, kind, bias):
        """The MoE experts' grouped linears: every numbered weight and bias carries the mode
        the layer was built with, not the None that Megatron hands to TE."""
        cls = {
            "column": te_ext_grouped.TEColumnParallelGroupedLinear,
            "row": te_ext_grouped.TERowParallelGroupedLinear,
        }[kind]
        layer = cls(
            2,
            32,
            16,
            config=tiny_config(moe_grouped_gemm=True),
            init_method=torch.nn.init.normal_,
            bias=bias,
            skip_bias_add=False,
            is_expert=True,
        )
        names = {"weight0", "weight1"} | ({"bias0", "bias1"} if bias else set())
        assert tags(layer) == {name: kind for name in names}
        assert all(p.allreduce is True for p in layer.parameters())  # no expert parallelism


@pytest.mark.gpu
class TestTELinearParallelModeTagsRealTE:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def test_every_te_linear_parameter_is_tagged(self):
        pytest.importorskip("transformer_engine")
        from megatron.core.extensions import transformer_engine as te_ext

        for cpu_init in (True, False):
            config = tiny_config(use_cpu_initialization=cpu_init, moe_grouped_gemm=True)
            for kind in ("column", "row", "duplicated"):
                for is_expert in (False, True) if kind != "duplicated" else (False,):
                    layer = build(te_ext, kind, config, is_expert=is_expert)
                    found = tags(layer)
                    assert found and set(found.values()) == {kind}, (kind, is_expert, found)
            found = tags(build_layernorm_column(te_ext, config, bias=True))
            assert found == layernorm_column_tags(bias=True), found
            for cls, kind in (
                (te_ext.TEColumnParallelGroupedLinear, "column"),
                (te_ext.TERowParallelGroupedLinear, "row"),
            ):
                layer = cls(
                    2,
                    32,
                    16,
                    config=config,
                    init_method=torch.nn.init.normal_,
                    bias=True,
                    skip_bias_add=False,
                    is_expert=True,
                )
                found = tags(layer)
                assert found and set(found.values()) == {kind}, (cls.__name__, found)
