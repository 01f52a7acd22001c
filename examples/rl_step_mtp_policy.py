"""One RL (policy-gradient) training step of a policy with an MTP layer, on the CPU.

The policy loss trains everything; the MTP loss trains the trunk and the MTP layer but not the
output layer (``mtp_detach_output_layer=True``), so the sampling head stays the policy's own.

    python examples/rl_step_mtp_policy.py
"""

import torch

from megatron.core import cpu_harness
from tiny_models import moe_config, gpt, token_batch


def main():
    with cpu_harness.single_process(seed=1234):
        policy = gpt(moe_config(mtp_detach_output_layer=True, mtp_loss_scaling_factor=0.1))
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
        tokens, positions, mask = token_batch(seed=1)   # stands in for sampled rollouts
        advantages = torch.linspace(-1.0, 1.0, tokens.shape[0])[:, None]   # one per sequence

        for step in range(3):
            # With labels, GPTModel returns per-token cross-entropy = -log p(label); the MTP loss
            # is attached to the graph by the model and reaches backward on its own.
            neg_logp = policy(tokens, positions, mask, labels=tokens)
            policy_loss = (advantages * neg_logp).mean()
            optimizer.zero_grad()
            policy_loss.backward()
            head_grad = policy.output_layer.weight.grad.norm().item()
            # The MTP loss reached backward: the MTP layer (which the policy loss does not use) learns.
            mtp_grads = [p.grad for n, p in policy.named_parameters() if n.startswith("mtp.")]
            assert mtp_grads and all(g is not None for g in mtp_grads)
            assert sum(g.abs().sum() for g in mtp_grads) > 0
            if step == 0:
                # ...but not the output layer: its gradient is the policy loss's alone.
                neg_logp_alone = policy(tokens, positions, mask, labels=tokens, compute_mtp=False)
                without_mtp = (advantages * neg_logp_alone).mean()
                (head_only,) = torch.autograd.grad(without_mtp, policy.output_layer.weight)
                torch.testing.assert_close(policy.output_layer.weight.grad, head_only)
            optimizer.step()
            print(f"step {step}: policy loss {policy_loss.item():+.4f}, output-layer grad norm {head_grad:.4f}")
            assert torch.isfinite(policy_loss)
    print("ok")


if __name__ == "__main__":
    main()
