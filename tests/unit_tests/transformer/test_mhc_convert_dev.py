"""A release-line mHC checkpoint on upstream dev's mHC (the upstream-dev line).

The release line's GPT state dict with mHC and an MTP layer (names and shapes pinned in
``mhc_convert_release_keys``, which the release line checks against its real model) is
converted with ``mhc_convert.fork_to_upstream_dev``, loaded into dev's GPT model (dev's
``HyperConnectionTransformerLayer``, its ``learned_output_contract`` and its mHC MTP layer with
``e_proj`` / ``h_proj``) with ``strict=True``, and run. The reference is the fork's mHC math in
float64 on the same weights: dev's model in float64 with each ``HyperConnectionModule``'s
mappings and both contractions replaced by the fork's formulas, written here from the release
line's documented math (RMS with ``layernorm_epsilon``, pre/head floor 1e-6, log-domain Sinkhorn:
rows, then ``iters`` x (columns, rows), ``x'_i = sum_j H[i, j] x_j``). Everything else in the two
models is the same Megatron layer.

The converted model is close to, not equal to, the source: the tests assert the bound stated in
``docs/line-upstream-dev.md``; ``python -m tests.unit_tests.transformer.test_mhc_convert_dev``
on the line's tree prints the measured differences. On a base without dev's mHC the tests skip.
"""

import pytest
import torch

from megatron.core.transformer import hyper_connection
from tests.unit_tests.test_utilities import Utils, rerun_as_on_a_cpu_only_machine
from tests.unit_tests.transformer.mhc_convert_release_keys import (
    HIDDEN,
    NUM_STREAMS,
    synthetic_release_state_dict,
)

pytestmark = pytest.mark.skipif(
    not hasattr(hyper_connection, "learned_output_contract"),
    reason="no upstream dev mHC on this base (the release line's model is tested in test_mhc_convert.py)",
)

# Stated bound (docs/line-upstream-dev.md): max |converted - fork reference| over the logits and
# the MTP block's output, fp32 run against the float64 reference, for both weight settings.
LOGITS_BOUND = 1e-2
HIDDEN_BOUND = 5e-2


def _fork_rms(x, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _fork_sinkhorn(logits, iters):
    log_m = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    for _ in range(iters):
        log_m = log_m - torch.logsumexp(log_m, dim=-2, keepdim=True)
        log_m = log_m - torch.logsumexp(log_m, dim=-1, keepdim=True)
    return log_m.exp()


def _fork_rows(t, n):
    """dev's storage -> the fork's: residual block transposed (written independently of the
    converter, index by index)."""
    out = t.clone()
    for i in range(n):
        for j in range(n):
            out[2 * n + i * n + j] = t[2 * n + j * n + i]
    return out


def fork_mappings(module, x):
    """The fork's H_pre, H_post, H_res for dev's module ``module`` on ``x [s, b, n*h]``; H_res
    is returned transposed because dev applies ``H_res^T``."""
    n, eps = module.n, module.config.layernorm_epsilon
    w = _fork_rows(module.mapping_proj.weight.double(), n)
    b = _fork_rows(module.bias.double(), n)
    z = torch.nn.functional.linear(_fork_rms(x.double(), eps), w)
    h_pre = torch.sigmoid(module.alpha_pre.double() * z[..., :n] + b[:n]) + 1e-6
    h_post = 2.0 * torch.sigmoid(module.alpha_post.double() * z[..., n : 2 * n] + b[n : 2 * n])
    res = (module.alpha_res.double() * z[..., 2 * n :] + b[2 * n :]).unflatten(-1, (n, n))
    h_res = _fork_sinkhorn(res, module.sinkhorn_iterations)
    return h_pre.to(x.dtype), h_post.to(x.dtype), h_res.transpose(-1, -2).contiguous().to(x.dtype)


def fork_contract(hidden_states, head_fn, base, scale, n, eps):
    """The fork's HyperConnectionHead: floor 1e-6 (dev's learned_output_contract uses eps)."""
    x = hidden_states.double()
    z = torch.nn.functional.linear(_fork_rms(x, eps), head_fn.double())
    weights = torch.sigmoid(scale.double() * z + base.double()) + 1e-6
    out = (weights.unsqueeze(-1) * x.unflatten(-1, (n, x.shape[-1] // n))).sum(-2)
    return out.to(hidden_states.dtype)


def with_host_extra_state(model, state):
    """``state`` plus the model's own Transformer Engine ``_extra_state`` entries it lacks.

    The pinned release key list is the release model's on a machine without TE; on a TE host
    both models build TE norms, whose ``_extra_state`` a release checkpoint would carry and the
    converter passes through unchanged. Nothing else may be missing.
    """
    missing = set(model.state_dict()) - set(state)
    assert all(k.endswith("._extra_state") for k in missing), sorted(missing)
    own = model.state_dict()
    return {**state, **{k: own[k] for k in missing}}


def _run(model, tokens, position_ids, mask):
    seen = {}
    handle = model.mtp.register_forward_hook(lambda m, a, out: seen.setdefault("mtp", out))
    with torch.no_grad():
        logits = model(tokens, position_ids, mask)
    handle.remove()
    return logits, seen["mtp"]


def measure(res_noise, seed=0):
    """(max |logits|, max |MTP block output| differences): fp32 converted model against the
    float64 fork reference, and the float64 converted model against it (math only)."""
    from megatron.core.transformer import multi_token_prediction, transformer_block
    from megatron.core.transformer.mhc_convert import fork_to_upstream_dev
    from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import causal_batch
    from tests.unit_tests.transformer.test_dev_mhc_multistream import dev_mhc_mtp_model

    converted = fork_to_upstream_dev(synthetic_release_state_dict(seed, res_noise), NUM_STREAMS)

    def build(dtype):
        model = dev_mhc_mtp_model(use_fused_mhc=False, params_dtype=dtype).eval()
        assert model.config.num_residual_streams == NUM_STREAMS
        assert model.config.hidden_size == HIDDEN
        model.load_state_dict(with_host_extra_state(model, converted), strict=True)
        return model.to(dtype)

    batch = causal_batch()
    got = _run(build(torch.float32), *batch)
    got64 = _run(build(torch.float64), *batch)
    ref = build(torch.float64)
    for module in ref.modules():
        if isinstance(module, hyper_connection.HyperConnectionModule):
            module.compute_mappings = lambda x, module=module: fork_mappings(module, x)
    patched = [transformer_block, multi_token_prediction]
    saved = [m.learned_output_contract for m in patched]
    try:
        for m in patched:
            m.learned_output_contract = fork_contract
        want = _run(ref, *batch)
    finally:
        for m, f in zip(patched, saved):
            m.learned_output_contract = f

    def gaps(pair):
        return tuple((a.double() - b).abs().max().item() for a, b in zip(pair, want))

    return {"fp32": gaps(got), "fp64": gaps(got64), "scale": tuple(t.abs().max().item() for t in want)}


def _ran_as_on_a_cpu_only_machine(request) -> bool:
    """On a CUDA host, run this test in a subprocess as on a CPU-only machine (raising if it fails
    there) and return True: the math is checked against a float64 reference, and on a TE host the
    block's final norm is TE's, which has no float64."""
    if not torch.cuda.is_available():
        return False
    rerun_as_on_a_cpu_only_machine(request.node.nodeid)
    return True


class TestReleaseCheckpointOnDev:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.parametrize("res_noise", [0.0, 1.0], ids=["init-like", "trained-like"])
    def test_converted_release_checkpoint_is_within_the_stated_bound(self, res_noise, request):
        if _ran_as_on_a_cpu_only_machine(request):
            return
        got = measure(res_noise)
        logits_gap, hidden_gap = got["fp32"]
        assert logits_gap < LOGITS_BOUND, got
        assert hidden_gap < HIDDEN_BOUND, got
        # close, not equal: the Sinkhorn schedules, the RMS and the head floor differ, and the
        # difference is the math's (float64 on both sides), not fp32 rounding
        assert got["fp64"][0] > 1e-6, got

    def test_the_reference_is_the_fork_math_not_dev_math(self, request):
        """The float64 reference must not be dev's own forward: on the same weights, patching
        only the schedule back to dev's gives dev's float64 output (within rounding)."""
        if _ran_as_on_a_cpu_only_machine(request):
            return
        from megatron.core.transformer.mhc_convert import fork_to_upstream_dev
        from tests.unit_tests.transformer.test_dev_mhc_multistream import dev_mhc_mtp_model

        model = dev_mhc_mtp_model(use_fused_mhc=False).eval()
        model.load_state_dict(
            with_host_extra_state(
                model, fork_to_upstream_dev(synthetic_release_state_dict(1, res_noise=1.0), NUM_STREAMS)
            ),
            strict=True,
        )
        m64 = model.decoder.layers[0].self_attention_hyper_connection.double()
        x = torch.randn(3, 2, NUM_STREAMS * HIDDEN, dtype=torch.float64)
        dev_pre, dev_post, dev_res = m64.compute_mappings(x)
        fork_pre, fork_post, fork_res = fork_mappings(m64, x)
        # same pre/post up to the RMS epsilon; H_res differs by the schedule
        torch.testing.assert_close(fork_pre, dev_pre, rtol=0, atol=1e-4)
        torch.testing.assert_close(fork_post, dev_post, rtol=0, atol=1e-4)
        assert (fork_res - dev_res).abs().max() > 1e-4
        # both are (nearly) doubly stochastic in dev's layout: columns sum to 1 (dev ends there)
        torch.testing.assert_close(fork_res.sum(-2), torch.ones(3, 2, NUM_STREAMS, dtype=torch.float64))


if __name__ == "__main__":
    from tests.unit_tests import cpu_compat

    cpu_compat.install()
    Utils.initialize_model_parallel(1, 1)
    for noise, label in ((0.0, "init-like"), (1.0, "trained-like")):
        r = measure(noise)
        print(
            f"{label}: max|ref| logits {r['scale'][0]:.3g} mtp-out {r['scale'][1]:.3g}; "
            f"fp32 converted vs fp64 fork: logits {r['fp32'][0]:.3e} mtp-out {r['fp32'][1]:.3e}; "
            f"fp64 converted vs fp64 fork: logits {r['fp64'][0]:.3e} mtp-out {r['fp64'][1]:.3e}"
        )
