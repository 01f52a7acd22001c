"""Upstream dev's mHC names (enable_hyper_connections, num_residual_streams) as deprecated aliases
of upstream main's (enable_mhc_connections, mhc_num_residual_streams)."""

import argparse
import dataclasses
import warnings

import pytest
import torch

from megatron.core.transformer import TransformerConfig
from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import (
    build_gpt,
    causal_batch,
    tiny_moe_mtp_config,
)
from tests.unit_tests.test_utilities import Utils


def config(**overrides):
    return tiny_moe_mtp_config(mtp_num_layers=None, hidden_dropout=0.0, **overrides)


class TestMHCDevNameAliases:
    def test_dev_names_set_the_canonical_fields_with_a_deprecation_warning(self):
        with pytest.warns(DeprecationWarning, match="enable_hyper_connections.*enable_mhc_conn"):
            cfg = config(enable_hyper_connections=True, num_residual_streams=2)
        assert cfg.enable_mhc_connections is True and cfg.mhc_num_residual_streams == 2
        # the alias mirrors the canonical value, so readers of either name agree
        assert cfg.enable_hyper_connections is True and cfg.num_residual_streams == 2
        # the warning points at the code that built the config with the dev name
        with pytest.warns(DeprecationWarning) as caught:
            TransformerConfig(
                num_layers=2, hidden_size=32, num_attention_heads=4, enable_hyper_connections=True
            )
        ours = [w for w in caught if "enable_hyper_connections" in str(w.message)]
        assert [w.filename for w in ours] == [__file__], [(w.filename, w.lineno) for w in ours]

    def test_canonical_names_alone_need_no_alias_and_do_not_warn(self):
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            cfg = config(enable_mhc_connections=True, mhc_num_residual_streams=3)
        assert cfg.enable_hyper_connections is True and cfg.num_residual_streams == 3
        off = config()
        assert off.enable_mhc_connections is False and off.enable_hyper_connections is False

    def test_consistent_settings_of_both_are_accepted(self):
        cfg = config(
            enable_mhc_connections=True,
            enable_hyper_connections=True,
            mhc_num_residual_streams=2,
            num_residual_streams=2,
        )
        assert cfg.mhc_num_residual_streams == 2
        # set by the canonical names alone, the (unset) aliases take their values: readers of the
        # dev names see the same setting
        canonical_only = config(enable_mhc_connections=True, mhc_num_residual_streams=3)
        assert canonical_only.enable_hyper_connections is True
        assert canonical_only.num_residual_streams == 3
        # a round trip through the field values (both names present) is consistent too
        again = TransformerConfig(
            **{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init}
        )
        assert again.mhc_num_residual_streams == 2 and again.num_residual_streams == 2

    @pytest.mark.parametrize(
        "kwargs, names",
        [
            (dict(mhc_num_residual_streams=2, num_residual_streams=8), "num_residual_streams=8"),
            (
                dict(enable_mhc_connections=True, enable_hyper_connections=False),
                "enable_hyper_connections=False",
            ),
        ],
    )
    def test_inconsistent_settings_of_both_are_refused(self, kwargs, names):
        kwargs.setdefault("enable_mhc_connections", True)
        with pytest.raises(ValueError, match=f"inconsistent mHC settings: {names}"):
            config(**kwargs)

    def test_dev_and_main_names_build_the_same_model(self):
        Utils.initialize_model_parallel(1, 1)
        try:
            outputs = []
            for names in (
                dict(enable_hyper_connections=True, num_residual_streams=2),
                dict(enable_mhc_connections=True, mhc_num_residual_streams=2),
            ):
                torch.manual_seed(0)
                model = build_gpt(config(**names), with_mtp=False)
                tokens, position_ids, mask = causal_batch()
                outputs.append((model.state_dict(), model(tokens, position_ids, mask)))
            (sd_dev, out_dev), (sd_main, out_main) = outputs
            assert sd_dev.keys() == sd_main.keys()
            assert any("hyper_connection" in k for k in sd_main)
            torch.testing.assert_close(out_dev, out_main, rtol=0, atol=0)
        finally:
            Utils.destroy_model_parallel()

    def test_command_line_flags_of_the_aliases(self):
        from megatron.training.argument_utils import ArgumentGroupFactory

        factory = ArgumentGroupFactory(TransformerConfig)
        parser = argparse.ArgumentParser()
        for field in dataclasses.fields(TransformerConfig):
            if field.name in ("enable_hyper_connections", "num_residual_streams"):
                kwargs = factory._build_argparse_kwargs_from_field(field)
                parser.add_argument(*kwargs.pop("arg_names"), **kwargs)
        args = parser.parse_args([])
        assert args.enable_hyper_connections is None and args.num_residual_streams is None
        args = parser.parse_args(["--enable-hyper-connections", "--num-residual-streams", "2"])
        assert args.enable_hyper_connections is True and args.num_residual_streams == 2
