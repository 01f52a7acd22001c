"""Old-log-prob and reference-model forwards without paying for MTP, on the CPU.

* ``model(..., compute_mtp=False)`` runs the policy without its MTP block (old log-probs).
* ``mtp_free_config`` + ``load_state_dict_without_mtp`` build a reference model that has no MTP
  layers at all and load it from the policy's weights; its logits equal the policy's.

    python examples/reference_logprobs_without_mtp.py
"""

import torch

from megatron.core import cpu_harness
from megatron.core.models.gpt.mtp_free import load_state_dict_without_mtp, mtp_free_config
from tiny_models import gpt, moe_config, token_batch, token_logprobs


def main():
    with cpu_harness.single_process(seed=1234):
        config = moe_config()
        policy = gpt(config)
        tokens, positions, mask = token_batch(seed=2)

        with torch.no_grad():
            old_logp = token_logprobs(policy(tokens, positions, mask, compute_mtp=False), tokens)

        reference = gpt(mtp_free_config(config), with_mtp=False)
        load_state_dict_without_mtp(reference, policy.state_dict())
        assert not any(name.startswith("mtp.") for name, _ in reference.named_parameters())
        with torch.no_grad():
            ref_logp = token_logprobs(reference(tokens, positions, mask), tokens)

        gap = (old_logp - ref_logp).abs().max().item()
        print(f"old log-prob mean {old_logp.mean().item():.4f}; reference equals policy: max gap {gap:.2e}")
        assert torch.equal(old_logp, ref_logp)
    print("ok")


if __name__ == "__main__":
    main()
