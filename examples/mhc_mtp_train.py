"""A model with manifold hyper-connections (4 residual streams) and an MTP layer, trained a few
steps on the CPU; the loss falls.

    python examples/mhc_mtp_train.py
"""

import torch

from megatron.core import cpu_harness
from tiny_models import gpt, moe_config, token_batch


def main():
    with cpu_harness.single_process(seed=1234):
        policy = gpt(moe_config(enable_mhc_connections=True, mhc_num_residual_streams=4))
        streams = [n for n, _ in policy.named_parameters() if "hyper" in n or "mhc" in n]
        assert streams, "the model should carry mHC parameters"
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
    print("ok")


if __name__ == "__main__":
    main()
