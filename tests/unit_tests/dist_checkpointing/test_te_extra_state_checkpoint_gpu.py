"""A real Transformer Engine layer's FP8 extra state through a torch_dist save and load.

The CPU tests of the key recovery use a stand-in io.BytesIO; here TE itself produces the
``_extra_state`` (its FP8 scaling state after an FP8 step), and the loaded layer must come back
with the same scaling factors, through the fork's sharded-key recovery.
"""

import pytest
import torch

from tests.unit_tests.test_utilities import Utils


@pytest.mark.gpu
class TestTEExtraStateRoundTrip:
    def setup_method(self, method):
        if not torch.cuda.is_available():
            pytest.skip("needs CUDA")
        pytest.importorskip("transformer_engine")
        Utils.initialize_model_parallel(1, 1)
        torch.manual_seed(5)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def _layer(self):
        from megatron.core.extensions.transformer_engine import TEColumnParallelLinear
        from megatron.core.transformer import TransformerConfig

        config = TransformerConfig(
            num_layers=1, hidden_size=64, num_attention_heads=4, bf16=True,
            params_dtype=torch.bfloat16, fp8="hybrid", fp8_recipe="delayed",
        )  # fmt: skip
        return TEColumnParallelLinear(
            64, 128, config=config, init_method=torch.nn.init.normal_, gather_output=False,
            bias=False, skip_bias_add=False, is_expert=False,
        ).cuda()  # fmt: skip

    def test_fp8_scaling_state_survives_torch_dist_save_and_load(self, tmp_path, monkeypatch):
        import transformer_engine.pytorch as te
        from transformer_engine.common.recipe import DelayedScaling

        from megatron.core import dist_checkpointing, parallel_state

        # TE layers shard their state over the data-parallel group named in the metadata.
        metadata = {"dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
        layer = self._layer()
        x = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16) * 7.0
        with te.fp8_autocast(enabled=True, fp8_recipe=DelayedScaling(amax_history_len=4)):
            for _ in range(3):  # amax history fills, scales move away from 1
                out, _ = layer(x)
                out.float().sum().backward()
        scale = layer.fp8_meta["scaling_fwd"].scale.clone()
        assert not torch.all(scale == 1.0), "the FP8 step must have changed the scaling state"
        dist_checkpointing.save(layer.sharded_state_dict(prefix="layer.", metadata=metadata), str(tmp_path))

        def load_into_fresh_layer():
            fresh = self._layer()
            sharded = fresh.sharded_state_dict(prefix="layer.", metadata=metadata)
            loaded = dist_checkpointing.load(sharded, str(tmp_path))
            fresh.load_state_dict({k[len("layer."):]: v for k, v in loaded.items()})
            return fresh

        # TE >= 2.20 keeps delayed-scaling FP8 state as a pickle and refuses to unpickle it unless
        # the checkpoint is declared trusted (seen on the H200 with TE 2.20.2); older TE loads it.
        from megatron.core.utils import is_te_min_version

        monkeypatch.delenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", raising=False)
        if is_te_min_version("2.20.0"):
            with pytest.raises(RuntimeError, match="NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"):
                load_into_fresh_layer()
            monkeypatch.setenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", "1")  # our own checkpoint
        fresh = load_into_fresh_layer()
        torch.testing.assert_close(fresh.weight, layer.weight, rtol=0, atol=0)
        torch.testing.assert_close(fresh.fp8_meta["scaling_fwd"].scale, scale, rtol=0, atol=0)
