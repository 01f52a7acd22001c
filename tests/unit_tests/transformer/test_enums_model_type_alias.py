"""``ModelType.encoder_and_decoder``: the member upstream removed, kept for older model builders.

mbridge 0.15.1's ``get_model`` compares the model type with it on every build; without the member
that comparison raises AttributeError before any model exists. It must stay a distinct member
that no Megatron model reports.
"""

from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.enums import ModelType
from tests.unit_tests.test_utilities import Utils


def test_the_legacy_member_exists_and_is_distinct():
    legacy = ModelType.encoder_and_decoder
    assert legacy is not ModelType.encoder_or_decoder
    assert ModelType(legacy.value) is legacy
    assert [m.name for m in ModelType] == ["encoder_or_decoder", "encoder_and_decoder"]


def test_models_still_report_encoder_or_decoder():
    Utils.initialize_model_parallel(1, 1)
    try:
        config = TransformerConfig(
            num_layers=1, hidden_size=16, num_attention_heads=2, use_cpu_initialization=True
        )
        model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=32, max_sequence_length=8)
        assert model.model_type is ModelType.encoder_or_decoder
        assert model.model_type != ModelType.encoder_and_decoder
    finally:
        Utils.destroy_model_parallel()


def test_a_member_pickled_by_an_earlier_release_loads_as_it():
    # Checkpoints keep the run's args, model_type among them, pickled; an Enum member pickles
    # by value, and the releases that had this member gave it 2. These are the bytes such a
    # release wrote (protocol 2: ModelType called with 2).
    import pickle

    written_by_an_earlier_release = b"\x80\x02cmegatron.core.transformer.enums\nModelType\nK\x02\x85R."
    assert pickle.loads(written_by_an_earlier_release) is ModelType.encoder_and_decoder
