"""The release line's mHC config names on the upstream-dev line: refused, naming dev's fields and
the converter, instead of a bare "unexpected keyword argument" (or, worse, dev's mHC built for
weights laid out for the release line's).

On a base without dev's mHC the tests skip (the release line accepts both spellings).
"""

import pytest

from megatron.core.transformer import TransformerConfig, hyper_connection

pytestmark = pytest.mark.skipif(
    not hasattr(hyper_connection, "learned_output_contract"), reason="no upstream dev mHC on this base"
)

BASE = dict(num_layers=2, hidden_size=32, num_attention_heads=4, use_cpu_initialization=True)


@pytest.mark.parametrize(
    "release, dev",
    [
        ({"enable_mhc_connections": True}, "enable_hyper_connections"),
        ({"mhc_num_residual_streams": 4}, "num_residual_streams"),
        ({"enable_mhc_connections": False}, "enable_hyper_connections"),
    ],
)
def test_release_names_are_refused_naming_devs_fields_and_the_converter(release, dev):
    with pytest.raises(ValueError) as err:
        TransformerConfig(**BASE, **release)
    message = str(err.value)
    (name,) = release
    assert f"{name}=" in message and dev in message
    assert "fork_config_to_upstream_dev" in message and "enable_hyper_connection=True" in message


def test_devs_names_build_devs_mhc_and_leave_the_release_fields_unset():
    config = TransformerConfig(**BASE, enable_hyper_connections=True, num_residual_streams=2)
    assert config.enable_hyper_connections is True and config.num_residual_streams == 2
    assert config.enable_mhc_connections is None and config.mhc_num_residual_streams is None


def test_a_converted_release_config_builds_on_dev():
    from megatron.core.transformer.mhc_convert import fork_config_to_upstream_dev

    release = dict(enable_mhc_connections=True, mhc_num_residual_streams=2, mhc_sinkhorn_iterations=7)
    config = TransformerConfig(**BASE, **fork_config_to_upstream_dev(release))
    assert config.enable_hyper_connections is True and config.num_residual_streams == 2
    assert config.mhc_sinkhorn_iterations == 7
