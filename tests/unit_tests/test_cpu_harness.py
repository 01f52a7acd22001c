"""``megatron.core.cpu_harness`` lets a fresh process build and train a small model on the CPU.

Each case runs in a fresh interpreter: the test session itself already installed the tests' own
CUDA stand-ins (tests/unit_tests/cpu_compat.py), which would hide what the shipped helper does.
"""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.unit_tests.test_utilities import CPU_ONLY_PREAMBLE, cpu_only_environment

ROOT = Path(__file__).resolve().parents[2]

TRAIN_ONE_STEP = """
import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig

def train_step():
    config = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4,
                               use_cpu_initialization=True, hidden_dropout=0.1,
                               attention_dropout=0.1, add_bias_linear=False)
    model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=64, max_sequence_length=8)
    tokens = torch.randint(0, 64, (2, 8))
    positions = torch.arange(8).expand(2, 8)
    mask = torch.triu(torch.ones(8, 8), diagonal=1).bool()[None, None]
    loss = model(tokens, positions, mask, labels=tokens).mean()
    loss.backward()
    assert torch.isfinite(loss), loss
    return float(loss)
"""


def run_script(body: str) -> subprocess.CompletedProcess:
    """A fresh process, as a user's script on the CPU-only machine the harness is for (on a CUDA
    host too: no visible GPU, no Transformer Engine or APEX, no test-session rendezvous)."""
    script = CPU_ONLY_PREAMBLE + "\n" + TRAIN_ONE_STEP + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=cpu_only_environment(),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_without_the_harness_megatron_needs_cuda():
    proc = run_script("""
        import torch.distributed as dist
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
        parallel_state.initialize_model_parallel()
        print("model parallel set up", flush=True)
        model_parallel_cuda_manual_seed(1234)
        train_step()
        print("trained", flush=True)
    """)
    assert proc.returncode != 0
    assert "cuda" in proc.stderr.lower() or "nvidia" in proc.stderr.lower(), proc.stderr[-2000:]
    # It failed for the reason the harness exists: the gloo group and model parallelism came up,
    # then a call into torch.cuda raised (not some unrelated error that mentions CUDA in passing).
    assert "model parallel set up" in proc.stdout and "trained" not in proc.stdout, proc.stderr[-2000:]
    frames = re.findall(r'File "([^"]+)"', proc.stderr)
    assert frames and Path(frames[-1]).parent.name == "cuda" and "torch" in Path(frames[-1]).parts, \
        proc.stderr[-2000:]


@pytest.mark.slow
def test_single_process_trains_a_step_and_cleans_up():
    proc = run_script("""
        import torch.distributed as dist
        from megatron.core import cpu_harness, parallel_state
        with cpu_harness.single_process(seed=7):
            assert dist.get_world_size() == 1
            assert parallel_state.model_parallel_is_initialized()
            first = train_step()
        assert not dist.is_initialized()
        assert not parallel_state.model_parallel_is_initialized()
        with cpu_harness.single_process(seed=7):
            again = train_step()
        assert first == again, (first, again)   # same seed, same dropout masks and init
        print("LOSS", first)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LOSS" in proc.stdout


def test_initialize_refuses_a_multi_rank_group(monkeypatch):
    from megatron.core import cpu_harness

    class TwoRanks:
        @staticmethod
        def is_initialized():
            return True

        @staticmethod
        def get_world_size():
            return 2

    monkeypatch.setattr(cpu_harness, "install_cuda_stand_ins", lambda: False)
    monkeypatch.setattr(cpu_harness, "dist", TwoRanks)
    with pytest.raises(RuntimeError, match="one process, but the process group has 2 ranks"):
        cpu_harness.initialize()


@pytest.mark.slow
def test_alltoall_dispatcher_trains_a_step():
    # The alltoall dispatcher makes a torch.cuda.Stream for its device-to-host copies.
    proc = run_script("""
        from megatron.core import cpu_harness
        with cpu_harness.single_process(seed=7):
            config = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4,
                                       use_cpu_initialization=True, add_bias_linear=False,
                                       num_moe_experts=4, moe_router_topk=2,
                                       moe_token_dispatcher_type="alltoall")
            spec = get_gpt_layer_local_spec(num_experts=4, moe_grouped_gemm=False)
            model = GPTModel(config, spec, vocab_size=64, max_sequence_length=8)
            tokens = torch.randint(0, 64, (2, 8))
            positions = torch.arange(8).expand(2, 8)
            mask = torch.triu(torch.ones(8, 8), diagonal=1).bool()[None, None]
            loss = model(tokens, positions, mask, labels=tokens).mean()
            loss.backward()
            assert torch.isfinite(loss), loss
            grads = [p.grad for n, p in model.named_parameters() if "experts" in n]
            assert grads and all(g is not None for g in grads)
            print("LOSS", float(loss))
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LOSS" in proc.stdout
