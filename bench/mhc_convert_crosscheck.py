"""Is the float64 reference of test_mhc_convert_dev.py the release line's own model? (not a test)

The upstream-dev line's converter test compares dev's model, loaded with a converted release-line
state dict, against "the fork's mHC math in float64": dev's model with its mappings and
contractions replaced by the fork's formulas. This checks that reference against the release
line's real model, across the two trees: on the line's tree it saves the reference outputs
(logits, MTP block output) for the test's synthetic state dicts; on the release tree it runs the
release line's GPT (mHC + MTP, float64, native mHC) on the same state dicts and prints the
largest differences.

    cd LINE_TREE && PYTHONPATH=$PWD python bench/mhc_convert_crosscheck.py --save /tmp/ref.pt
    cd RELEASE_ROOT && PYTHONPATH=$PWD python bench/mhc_convert_crosscheck.py --compare /tmp/ref.pt
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETTINGS = (0.0, 1.0)  # residual-logit noise: init-like, trained-like


def save(path):
    import torch

    from megatron.core.transformer import hyper_connection, multi_token_prediction, transformer_block
    from megatron.core.transformer.mhc_convert import fork_to_upstream_dev
    from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import causal_batch
    from tests.unit_tests.transformer import test_mhc_convert_dev as t
    from tests.unit_tests.transformer.test_dev_mhc_multistream import dev_mhc_mtp_model

    out = {}
    for noise in SETTINGS:
        model = dev_mhc_mtp_model(use_fused_mhc=False, params_dtype=torch.float64).eval()
        converted = fork_to_upstream_dev(t.synthetic_release_state_dict(0, noise), t.NUM_STREAMS)
        model.load_state_dict(converted, strict=True)
        model = model.double()
        for module in model.modules():
            if isinstance(module, hyper_connection.HyperConnectionModule):
                module.compute_mappings = lambda x, module=module: t.fork_mappings(module, x)
        transformer_block.learned_output_contract = t.fork_contract
        multi_token_prediction.learned_output_contract = t.fork_contract
        out[noise] = t._run(model, *causal_batch())
    torch.save(out, path)
    print(f"saved the float64 reference outputs for {SETTINGS} to {path}")


def compare(path):
    import torch

    from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import build_gpt, causal_batch
    from tests.unit_tests.transformer.mhc_convert_release_keys import synthetic_release_state_dict
    from tests.unit_tests.transformer.test_hyper_connection import mhc_config

    ref = torch.load(path)
    for noise in SETTINGS:
        config = mhc_config(
            mtp_num_layers=1, num_moe_experts=None, params_dtype=torch.float64, use_fused_mhc=False
        )
        model = build_gpt(config).eval()
        model.load_state_dict(synthetic_release_state_dict(0, noise), strict=True)
        model = model.double()
        seen = {}
        model.mtp.register_forward_hook(lambda m, a, o: seen.setdefault("mtp", o))
        with torch.no_grad():
            logits = model(*causal_batch())
        mtp = seen["mtp"][0] if isinstance(seen["mtp"], tuple) else seen["mtp"]
        print(
            f"noise {noise}: release model vs the line's reference: logits "
            f"{(logits - ref[noise][0]).abs().max().item():.3e}, MTP block output "
            f"{(mtp - ref[noise][1]).abs().max().item():.3e}"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--save", help="on the upstream-dev line's tree: write the reference here")
    group.add_argument("--compare", help="on the release tree: compare with this reference")
    args = parser.parse_args()
    from tests.unit_tests import cpu_compat
    from tests.unit_tests.test_utilities import Utils

    cpu_compat.install()
    Utils.initialize_model_parallel(1, 1)
    save(args.save) if args.save else compare(args.compare)


if __name__ == "__main__":
    main()
