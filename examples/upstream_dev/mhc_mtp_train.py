"""Upstream dev's manifold hyper-connections (4 residual streams) with an MTP layer, trained a
few steps on the CPU on the upstream-dev line; the loss falls.

dev's mHC is switched on twice: the config field ``enable_hyper_connections`` (with
``num_residual_streams``) and the layer spec's ``enable_hyper_connection=True``, which builds
dev's ``HyperConnectionTransformerLayer``. The MTP block spec follows the decoder's.

    python -m tools.rebase apply --line upstream-dev --mirror PATH
    python examples/upstream_dev/mhc_mtp_train.py
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: the shared tiny models

from megatron.core import cpu_harness  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import (  # noqa: E402
    get_gpt_layer_local_spec,
    get_gpt_mtp_block_spec,
)
from megatron.core.transformer import hyper_connection  # noqa: E402
from tiny_models import SEQ_LEN, VOCAB, device, moe_config, token_batch  # noqa: E402


def dev_mhc_gpt():
    """GPT + MoE + one MTP layer with dev's mHC on local (non-TE) specs."""
    config = moe_config(
        enable_hyper_connections=True,
        num_residual_streams=4,
        # dev recommends recomputing the mHC activations (it warns without): its selective "mhc"
        recompute_granularity="selective",
        recompute_modules=["mhc"],
    )
    spec = get_gpt_layer_local_spec(
        num_experts=config.num_moe_experts, moe_grouped_gemm=False, enable_hyper_connection=True
    )
    mtp_spec = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False)
    model = GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=SEQ_LEN, mtp_block_spec=mtp_spec)
    return model.to(device())


def main():
    if not hasattr(hyper_connection, "HyperConnectionModule"):
        sys.exit("this example needs upstream dev's mHC: apply the upstream-dev line first "
                 "(python -m tools.rebase apply --line upstream-dev --mirror PATH)")
    with cpu_harness.single_process(seed=1234):
        policy = dev_mhc_gpt()
        mhc = [n for n, _ in policy.named_parameters() if "hyper_connection" in n]
        mtp_proj = [n for n, _ in policy.named_parameters() if n.startswith("mtp.") and "h_proj" in n]
        assert mhc and mtp_proj, "the model should carry dev's mHC and its MTP stream projection"
        optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-3)
        tokens, positions, mask = token_batch(seed=4)
        losses = []
        for step in range(12):
            loss = policy(tokens, positions, mask, labels=tokens).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            print(f"step {step:2d}: loss {loss.item():.4f}")
        assert losses[-1] < 0.8 * losses[0], losses
        assert all(p.grad is not None for n, p in policy.named_parameters() if n in mtp_proj)
    print("ok")


if __name__ == "__main__":
    main()
