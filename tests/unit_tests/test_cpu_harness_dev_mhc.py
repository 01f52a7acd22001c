"""``megatron.core.cpu_harness`` with upstream dev's mHC (the upstream-dev line): a user's fresh
process on a CPU-only machine trains dev's mHC + MTP on the local spec.

Two things stood in the way: dev's mHC opens ``torch.cuda.nvtx`` ranges, which a CPU build of
torch refuses (the harness's stand-in), and dev's MTP layer applies ``h_proj`` to the streams as
``[s, b, n, h]``, whose weight gradient the local linear could not take (patch
linear-wgrad-nd-input). Each case runs in a fresh interpreter, because the test session's own
CUDA stand-ins (tests/unit_tests/cpu_compat.py) would hide what the shipped helper does.

On a base without dev's mHC the tests skip.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from megatron.core.transformer import hyper_connection
from tests.unit_tests.test_utilities import CPU_ONLY_PREAMBLE, cpu_only_environment

pytestmark = pytest.mark.skipif(
    not hasattr(hyper_connection, "learned_output_contract"), reason="no upstream dev mHC on this base"
)

ROOT = Path(__file__).resolve().parents[2]


def run_script(body: str) -> subprocess.CompletedProcess:
    script = CPU_ONLY_PREAMBLE + "\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=cpu_only_environment(),
                          capture_output=True, text=True, timeout=300)


def test_nvtx_ranges_record_nothing_under_the_harness():
    proc = run_script("""
        import torch
        from megatron.core import cpu_harness
        with cpu_harness.single_process(seed=1):
            with torch.cuda.nvtx.range("HyperConnection::step"):
                torch.cuda.nvtx.range_push("inner")
                torch.cuda.nvtx.mark("here")
                torch.cuda.nvtx.range_pop()
        print("ranges ok")
    """)
    assert proc.returncode == 0 and "ranges ok" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.slow
def test_dev_mhc_with_mtp_trains_a_step_on_the_local_spec():
    proc = run_script("""
        import torch
        from megatron.core import cpu_harness
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_layer_local_spec, get_gpt_mtp_block_spec)
        from megatron.core.transformer import TransformerConfig

        with cpu_harness.single_process(seed=1):
            config = TransformerConfig(
                num_layers=2, hidden_size=32, num_attention_heads=4, mtp_num_layers=1,
                enable_hyper_connections=True, num_residual_streams=2, add_bias_linear=False,
                use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0,
                recompute_granularity="selective", recompute_modules=["mhc"])
            spec = get_gpt_layer_local_spec(enable_hyper_connection=True)
            mtp_spec = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False)
            model = GPTModel(config, spec, vocab_size=64, max_sequence_length=8,
                             mtp_block_spec=mtp_spec)
            tokens = torch.randint(0, 64, (2, 8))
            positions = torch.arange(8).expand(2, 8)
            mask = torch.triu(torch.ones(8, 8), diagonal=1).bool()[None, None]
            model(tokens, positions, mask, labels=tokens).mean().backward()
            h_proj = model.mtp.layers[0].h_proj.weight
            assert h_proj.grad is not None and h_proj.grad.abs().sum() > 0
            missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
            assert not missing, missing
        print("trained")
    """)
    assert proc.returncode == 0 and "trained" in proc.stdout, proc.stderr[-3000:]
