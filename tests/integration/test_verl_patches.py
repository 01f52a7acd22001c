"""verl 0.9.1's Megatron monkey patches applied on the fork, each with its expected outcome.

Either the patch works on the fork (same numbers as without it), or a fork feature it would
silently switch off refuses at use, naming the replaced symbol and verl. Runs on the CPU with
``megatron.core.cpu_harness`` against the installed verl (skipped when it is not installed).
"""

import io

import pytest
import torch

from megatron.core import fork_compat
from megatron.core.fork_compat import ForkSymbolReplaced
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction
from megatron.core.transformer.multi_token_prediction import MultiTokenPredictionLayer
from megatron.core.transformer.multi_latent_attention import MultiLatentAttention
from tests.integration.clients import batch, tiny_config, tiny_model, verl_module

pytestmark = pytest.mark.usefixtures("harness")


def _symbols(found):
    return sorted(item.symbol for item in found)


def test_patch_postprocess_runs_default_forwards_and_refuses_compute_mtp_false():
    mtp_patch = verl_module("verl.models.mcore.mtp_patch")
    model = tiny_model(tiny_config())
    tokens, positions, mask = batch()
    logits = model(tokens, positions, mask)

    mtp_patch.patch_postprocess(model)  # what verl does with mtp.enable
    assert torch.equal(model(tokens, positions, mask), logits)
    # verl's copy returns logits with labels too (verl computes the loss itself) and attaches
    # the MTP loss through the fork's process_mtp_loss.
    with_labels = model(tokens, positions, mask, labels=tokens)
    assert torch.equal(with_labels, logits)
    with_labels.float().logsumexp(-1).sum().backward()
    assert model.mtp.layers[0].eh_proj.weight.grad is not None, "the MTP loss trains MTP"

    with pytest.raises(RuntimeError, match=r"GPTModel\._postprocess was replaced by verl\."):
        model(tokens, positions, mask, compute_mtp=False)
    (item,) = fork_compat.replaced(model)
    assert item.symbol == "GPTModel._postprocess" and item.patcher == "verl"
    assert item.replacement == "verl.models.mcore.mtp_patch._megatron_gptmodel_postprocess"

    mtp_patch.unpatch_postprocess(model)
    assert fork_compat.replaced(model) == []


def test_mtp_inference_patch_passes_compute_mtp_through():
    patch = verl_module("verl.models.mcore.patch")
    model = tiny_model(tiny_config())
    tokens, positions, mask = batch()
    expected = model(tokens, positions, mask, compute_mtp=False)
    patch.apply_mtp_inference_patch()  # verl applies it on NPUs only
    assert _symbols(fork_compat.replaced()) == ["GPTModel._postprocess"]
    assert torch.equal(model(tokens, positions, mask, compute_mtp=False), expected)


def test_router_replay_patch_is_refused_at_mtp_build_and_by_the_fork_replay():
    replay_patch = verl_module("verl.utils.megatron.router_replay_patch")
    replay_patch.apply_router_replay_patch()

    if hasattr(TopKRouter, "_hash_routing"):
        # A base with DeepSeek-V4's hash router (upstream dev): verl rebinds the router module's
        # RouterReplay to its own class instead of replacing TopKRouter.__init__, so the first
        # router with R3 on refuses at build, with MTP or without.
        for mtp_layers in (1, None):
            with pytest.raises(
                ForkSymbolReplaced,
                match=r"RouterReplay was rebound to verl\.utils\.megatron\.router_replay_patch\."
                r"RouterReplay \(likely patched by 'verl'\)",
            ):
                tiny_model(tiny_config(moe_enable_routing_replay=True, mtp_num_layers=mtp_layers))
        return

    # verl's TopKRouter.__init__ gives the MTP layer's router a replay object of its own (it would
    # replay MTP routing too): the MTP layer refuses at build, naming verl's replacement.
    with pytest.raises(
        ForkSymbolReplaced,
        match=r"MTP layer's router .*verl\.utils\.megatron\.router_replay_patch\.RouterReplay.*"
        r"TopKRouter\.__init__ was replaced by verl\.",
    ):
        tiny_model(tiny_config(moe_enable_routing_replay=True))

    # Without MTP the model builds; the fork's replay is switched off: its registry is empty,
    # verl's RouterReplay holds the two decoder routers, and the fork's RouterReplay API refuses.
    replay_patch.RouterReplay.router_instances.clear()
    model = tiny_model(tiny_config(moe_enable_routing_replay=True, mtp_num_layers=None))
    assert RouterReplay.get_instances(model) == []
    assert len(replay_patch.RouterReplay.router_instances) == 2
    out = io.StringIO()
    found = fork_compat.check(model, file=out)
    assert {"TopKRouter.__init__", "TopKRouter.routing"} <= set(_symbols(found))
    assert all(item.patcher == "verl" for item in found), out.getvalue()
    with pytest.raises(ForkSymbolReplaced, match=r"TopKRouter\.__init__ was replaced by verl\."):
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD, model=model)


def test_recompute_backward_patch_is_refused_under_r3_with_full_recompute():
    patch = verl_module("verl.models.mcore.patch")
    config = tiny_config(
        moe_enable_routing_replay=True,
        recompute_granularity="full",
        recompute_method="uniform",
        recompute_num_layers=1,
    )
    model = tiny_model(config)
    model.train()
    tokens, positions, mask = batch()
    RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD, model=model)
    model(tokens, positions, mask, labels=tokens).sum().backward()  # fine before the patch

    patch.apply_patch_megatron_recomputation_backward()  # verl applies it on every CUDA run
    (item,) = fork_compat.replaced()
    assert item.symbol == "CheckpointFunction.backward" and item.patcher == "verl"
    with pytest.raises(ForkSymbolReplaced, match=r"CheckpointFunction\.backward was replaced by verl"):
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD, model=model)
    with pytest.raises(ForkSymbolReplaced, match=r"under activation recompute"):
        model(tokens, positions, mask, labels=tokens)


@pytest.mark.skipif(
    "sequence_roll_context" in MultiTokenPredictionLayer._get_embeddings.__code__.co_varnames,
    reason="upstream dev's MTP layer passes sequence_roll_context to _get_embeddings; verl 0.9.1's "
    "replacement does not take it (a TypeError at the MTP forward on pristine dev too)",
)
def test_mtp_embeddings_detach_works_and_is_refused_with_mtp_detach_output_layer():
    mtp_patch = verl_module("verl.models.mcore.mtp_patch")
    model = tiny_model(tiny_config())
    tokens, positions, mask = batch()
    assert mtp_patch.patch_mtp_layer_get_embeddings(model)  # verl: mtp.detach_encoder
    loss = model(tokens, positions, mask, labels=tokens)
    loss.sum().backward()
    assert model.mtp.layers[0].eh_proj.weight.grad is not None
    (item,) = fork_compat.replaced(model)
    assert item.symbol == "MultiTokenPredictionLayer._get_embeddings" and item.patcher == "verl"

    # mtp_detach_output_layer promises MTP gradients into the trunk; verl's copy cuts them.
    detached = tiny_model(tiny_config(mtp_detach_output_layer=True))
    mtp_patch.patch_mtp_layer_get_embeddings(detached)
    with pytest.raises(ForkSymbolReplaced, match=r"_get_embeddings was replaced by verl\."):
        detached(tokens, positions, mask, labels=tokens)


def _recompute_step(model, monkeypatch):
    """One training forward + backward under full recompute; (loss, grads, MTP checkpoint calls)."""
    from megatron.core import tensor_parallel

    checkpoint, mtp_calls = tensor_parallel.checkpoint, []

    def counting(function, *args, **kwargs):
        if "MultiTokenPredictionLayer._checkpointed_forward" in function.__qualname__:
            mtp_calls.append(function.__qualname__)
        return checkpoint(function, *args, **kwargs)

    monkeypatch.setattr(tensor_parallel, "checkpoint", counting)
    model.train()
    tokens, positions, mask = batch()
    loss = model(tokens, positions, mask, labels=tokens)
    loss.sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, mtp_calls


def test_mtp_checkpointed_forward_patch_leaves_the_fork_s_recompute_and_its_numbers(monkeypatch):
    """verl wraps ``_checkpointed_forward(forward_func, *args)`` to keep non-tensor arguments out
    of the saved tensors; 0.19's (and the fork's) takes the layer's own arguments and already keeps
    those in a closure. verl's patch checks the first parameter and leaves such a layer alone."""
    mtp_patch = verl_module("verl.models.mcore.mtp_patch")
    config = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    expected_loss, expected_grads, calls = _recompute_step(tiny_model(tiny_config(**config)), monkeypatch)
    assert len(calls) == 1, "the MTP layer's forward runs under the checkpoint"
    assert any(name.startswith("mtp.") for name in expected_grads)

    model = tiny_model(tiny_config(**config))
    fork_method = model.mtp.layers[0]._checkpointed_forward
    assert mtp_patch.patch_mtp_layer_checkpointed_forward(model) is False  # what verl does with mtp.enable
    layer = model.mtp.layers[0]
    assert "_checkpointed_forward" not in vars(layer) and not hasattr(layer, "_checkpointed_forward_backup")
    assert layer._checkpointed_forward == fork_method
    assert fork_compat.replaced(model) == []
    loss, grads, calls = _recompute_step(model, monkeypatch)
    assert len(calls) == 1
    assert torch.equal(loss, expected_loss)
    assert grads.keys() == expected_grads.keys()
    assert all(torch.equal(grads[name], expected_grads[name]) for name in grads), \
        [name for name in grads if not torch.equal(grads[name], expected_grads[name])]


def test_version_gated_patches_change_nothing_on_the_fork():
    patch = verl_module("verl.models.mcore.patch")
    forward = MultiLatentAttention.forward
    patch.apply_patch()  # MLA fixes for megatron-core < 0.13 / < 0.16.2
    patch.apply_patch_mbridge()  # a helper 0.19 has
    patch.apply_patch_megatron_v012_with_torch_v28_v29()  # megatron-core 0.12.1 only
    assert MultiLatentAttention.forward is forward
    assert fork_compat.replaced() == []
    model = tiny_model(tiny_config())
    assert not any("_postprocess" in vars(m) for m in model.modules())
    assert isinstance(model, GPTModel)
