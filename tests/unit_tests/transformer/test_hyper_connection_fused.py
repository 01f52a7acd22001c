"""Fused Triton mHC kernels (megatron/core/transformer/hyper_connection_fused.py).

Every fused function is checked, forward and every gradient, against the mHC formulas written
here in float64 plain torch (independently of both implementations), and against the native
reference functions of hyper_connection.py. The contract: log-domain Sinkhorn whose rows are
exactly normalised, new stream i = sum_j H_res[i, j] x_j + H_post[i] y.

CPU: the kernels run in Triton's interpreter, which needs ``TRITON_INTERPRET=1`` before triton is
imported, so ``test_interpreter_suite_in_subprocess`` runs ``TestFusedKernelsInterpreter`` in a
child process with the variable set (tiny shapes: a ragged token count, n = 3 (padded to 4 lanes)
and n = 4, hidden sizes that are not powers of two). GPU (``gpu`` marker, run on the H200): the
same checks in fp32 and bf16 at a real hidden size, the module path against the native path, and
a bf16 GPT step with the fused default against the native path.
"""


import pytest
import torch

triton = pytest.importorskip("triton")

from megatron.core.transformer import hyper_connection as native
from megatron.core.transformer import hyper_connection_fused as fused
from megatron.core.transformer.hyper_connection import HyperConnection, HyperConnectionHead
from tests.unit_tests.test_utilities import Utils
from tests.unit_tests.triton_interpreter import (
    assert_interpreter_suite_passes,
    interpreter_parent,
)

EPS = 1e-5
ITERS = 6


# --------------------------------------------------------------------------------------------
# float64 formulas
# --------------------------------------------------------------------------------------------
def _sig(t):
    return 1.0 / (1.0 + torch.exp(-t))


def _ref_sinkhorn(logits, iters):
    """Sinkhorn as alternating scalings in probability space (float64, moderate logits)."""
    p = torch.exp(logits - logits.amax(dim=(-1, -2), keepdim=True))
    p = p / p.sum(-1, keepdim=True)
    for _ in range(iters):
        p = p / p.sum(-2, keepdim=True)
        p = p / p.sum(-1, keepdim=True)
    return p


def _ref_rms(x):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS)


def _ref_all(p, n):
    """Sublayer mHC with y = tanh(u), then the contraction head, in float64 from ``p``."""
    x = p["x"]
    T = x.shape[0]
    h = x.shape[1] // n
    z = _ref_rms(x) @ p["w"].T
    b = p["b"]
    h_pre = _sig(p["a_pre"] * z[:, :n] + b[:n]) + 1e-6
    h_post = 2.0 * _sig(p["a_post"] * z[:, n : 2 * n] + b[n : 2 * n])
    h_res = _ref_sinkhorn((p["a_res"] * z[:, 2 * n :] + b[2 * n :]).reshape(T, n, n), ITERS)
    streams = x.reshape(T, n, h)
    u = torch.stack([sum(h_pre[t, j] * streams[t, j] for j in range(n)) for t in range(T)])
    y = torch.tanh(u)
    new = torch.stack(
        [
            torch.stack(
                [sum(h_res[t, i, j] * streams[t, j] for j in range(n)) + h_post[t, i] * y[t]
                 for i in range(n)]  # fmt: skip
            )
            for t in range(T)
        ]
    ).reshape(T, n * h)
    wh = _sig(p["head_scale"] * (_ref_rms(new) @ p["head_fn"].T) + p["head_base"]) + 1e-6
    out = torch.einsum("tj,tjh->th", wh, new.reshape(T, n, h))
    return dict(h_pre=h_pre, h_post=h_post, h_res=h_res, u=u, new=new, out=out)


def _impl_all(mod, p, n):
    """The same computation through one implementation's functions."""
    h_pre, h_post, h_res = mod.mhc_mappings(
        p["x"], p["w"], p["b"], p["a_pre"], p["a_post"], p["a_res"],
        num_streams=n, sinkhorn_iters=ITERS, norm_eps=EPS,
    )  # fmt: skip
    u = mod.pre_aggregate(p["x"], h_pre)
    new = mod.post_combine(p["x"], h_res, h_post, torch.tanh(u))
    wh = mod.head_weights(new, p["head_fn"], p["head_base"], p["head_scale"], norm_eps=EPS)
    out = mod.pre_aggregate(new, wh)
    return dict(h_pre=h_pre, h_post=h_post, h_res=h_res, u=u, new=new, out=out)


def _impl_input(mod, p, n, linked=True):
    """The same computation with the sublayer input through ``mhc_input`` (one autograd node in
    the fused path: its backward writes dx once); H_pre is internal there, so not compared.
    ``linked``: the combine gets the same ``x`` object (the fused path then routes its dx through
    that node); otherwise another view of it (its dx is summed by autograd)."""
    u, h_post, h_res = mod.mhc_input(
        p["x"], p["w"], p["b"], p["a_pre"], p["a_post"], p["a_res"],
        num_streams=n, sinkhorn_iters=ITERS, norm_eps=EPS,
    )  # fmt: skip
    x = p["x"] if linked else p["x"].view_as(p["x"])
    new = mod.post_combine(x, h_res, h_post, torch.tanh(u))
    wh = mod.head_weights(new, p["head_fn"], p["head_base"], p["head_scale"], norm_eps=EPS)
    out = mod.pre_aggregate(new, wh)
    return dict(h_post=h_post, h_res=h_res, u=u, new=new, out=out)


def _impl_input_unlinked(mod, p, n):
    return _impl_input(mod, p, n, linked=False)


def _params(T, n, h, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    C = n * n + 2 * n

    def r(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

    p = dict(
        x=r(T, n * h), w=r(C, n * h, scale=0.5), b=r(C), a_pre=r(1).abs() + 0.5,
        a_post=r(1).abs() + 0.5, a_res=r(1).abs() + 0.5, head_fn=r(n, n * h, scale=0.5),
        head_base=r(n), head_scale=r(1).abs() + 0.5,
    )  # fmt: skip
    return {k: v.to(device=device, dtype=dtype) for k, v in p.items()}, gen


def _run(fn, p, n):
    """Outputs and the gradient of a random projection of all outputs w.r.t. every input."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in p.items()}
    outs = fn(leaves, n)
    g = torch.Generator().manual_seed(99)
    loss = sum(
        (o.double() * torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.device)).sum()
        for o in outs.values()
    )
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return outs, dict(zip(leaves.keys(), grads))


def _rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _compare_against_float64(T, n, h, dtype, device, tol, impl=_impl_all):
    p, _ = _params(T, n, h, dtype, device, seed=T * 100 + n * 10 + h)
    nat_outs, nat_grads = _run(lambda q, n: impl(native, q, n), p, n)
    fus_outs, fus_grads = _run(lambda q, n: impl(fused, q, n), p, n)

    def ref(q, n):
        return {k: v for k, v in _ref_all(q, n).items() if k in nat_outs}

    ref_outs, ref_grads = _run(ref, {k: v.double() for k, v in p.items()}, n)
    for name in ref_outs:
        assert fus_outs[name].dtype == nat_outs[name].dtype, name
        assert torch.isfinite(fus_outs[name]).all(), name
        err, nat = _rel(fus_outs[name], ref_outs[name]), _rel(nat_outs[name], ref_outs[name])
        assert err <= max(tol, 2.0 * nat), (name, err, nat)
    for name in ref_grads:
        assert fus_grads[name].dtype == p[name].dtype, name
        assert torch.isfinite(fus_grads[name]).all(), name
        err, nat = _rel(fus_grads[name], ref_grads[name]), _rel(nat_grads[name], ref_grads[name])
        assert err <= max(tol, 2.0 * nat), ("grad", name, err, nat)


def _check_sinkhorn_extremes(device):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(96, 4, 4, generator=gen) * 1e3
    logits[::3, :, 1] -= 3e38  # a column far below the rest
    logits[1::3, 2, :] += 1e30  # a row far above
    logits = logits.to(device).requires_grad_(True)
    m = fused.sinkhorn_log(logits, 20)
    assert torch.isfinite(m).all() and (m >= 0).all()
    torch.testing.assert_close(m.sum(-1), torch.ones(96, 4, device=device), atol=1e-5, rtol=0)
    cot = torch.randn(m.shape, generator=gen).to(device)
    (g,) = torch.autograd.grad(m, logits, cot)
    assert torch.isfinite(g).all()
    ref_logits = logits.detach().clone().requires_grad_(True)
    ref = native.sinkhorn_log(ref_logits, 20)
    (ref_g,) = torch.autograd.grad(ref, ref_logits, cot)
    torch.testing.assert_close(m, ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(g, ref_g, atol=1e-4, rtol=1e-3)


def _mhc_module_config(n, h, dtype, fused_flag, cpu):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=1, hidden_size=h, num_attention_heads=1, enable_mhc_connections=True,
        mhc_num_residual_streams=n, mhc_sinkhorn_iterations=ITERS, use_fused_mhc=fused_flag,
        use_cpu_initialization=cpu, params_dtype=dtype, bf16=dtype == torch.bfloat16,
    )  # fmt: skip


def _modules_fused_vs_native(n, h, s, b, dtype, device, tol):
    """HyperConnection + head through the module API: use_fused_mhc=True vs False."""
    cpu = device == "cpu"
    mods = {}
    for flag in (True, False):
        torch.manual_seed(5)
        cfg = _mhc_module_config(n, h, dtype, flag, cpu)
        hc, head = HyperConnection(cfg).to(device), HyperConnectionHead(cfg).to(device)
        with torch.no_grad():  # leave the near-identity init so every mapping matters
            hc.alpha_pre.fill_(0.8), hc.alpha_post.fill_(0.8), hc.alpha_res.fill_(0.8)
            hc.mapping_weight.normal_(0.0, 0.3, generator=torch.Generator(device).manual_seed(1))
        mods[flag] = (hc, head)
    results = {}
    for flag, (hc, head) in mods.items():
        gen = torch.Generator().manual_seed(7)
        x = torch.randn(s, b, n * h, generator=gen).to(device=device, dtype=dtype)
        x.requires_grad_(True)
        sub_in, h_post, h_res = hc(x)
        y = torch.tanh(sub_in.float()).to(dtype)
        new = hc.combine(x, h_post, h_res, (y, None), 0.0, True)
        out = head(new)
        loss = (out.float() * torch.randn(out.shape, generator=gen).to(device)).sum()
        loss = loss + (new.float() * torch.randn(new.shape, generator=gen).to(device)).sum()
        loss.backward()
        grads = {k: p.grad for k, p in list(hc.named_parameters()) + list(head.named_parameters())}
        results[flag] = (out, new, x.grad, grads)
    f, r = results[True], results[False]
    for a, c in zip(f[:3], r[:3]):
        assert a.dtype == c.dtype and _rel(a, c) < tol, _rel(a, c)
    for k in r[3]:
        assert _rel(f[3][k], r[3][k]) < tol, (k, _rel(f[3][k], r[3][k]))


def _saved_large_tensors(fn, x):
    """Tensors autograd saves during ``fn(x)`` that are at least as large as ``x``."""
    saved = []

    def pack(t):
        if t.numel() >= x.numel():
            saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x)
    return saved


def _saved_stream_copies(mod, device, dtype):
    """What ``mod``'s mHC sublayer keeps for backward that is as large as the streams ``x`` but is
    not ``x`` itself: the copies of the streams (empty for the fused path)."""
    n, h, T = 4, 16, 64  # x larger than the mapping weight
    p, _ = _params(T, n, h, dtype, device, seed=11)
    p = {k: v.requires_grad_(True) for k, v in p.items()}
    x = p["x"]

    def sublayer(x):
        hp, hq, hr = mod.mhc_mappings(
            x, p["w"], p["b"], p["a_pre"], p["a_post"], p["a_res"],
            num_streams=n, sinkhorn_iters=ITERS, norm_eps=EPS,
        )  # fmt: skip
        u = mod.pre_aggregate(x, hp)
        new = mod.post_combine(x, hr, hq, torch.tanh(u))
        u2, hq2, hr2 = mod.mhc_input(
            x, p["w"], p["b"], p["a_pre"], p["a_post"], p["a_res"],
            num_streams=n, sinkhorn_iters=ITERS, norm_eps=EPS,
        )  # fmt: skip
        return new + mod.post_combine(x, hr2, hq2, torch.tanh(u2))

    return [t for t in _saved_large_tensors(sublayer, x) if t.data_ptr() != x.data_ptr()]


# --------------------------------------------------------------------------------------------
# CPU: configuration and dispatch (no kernels run)
# --------------------------------------------------------------------------------------------
class TestFusedConfigAndDispatch:
    def test_default_is_fused_where_possible(self):
        cfg = _mhc_module_config(2, 8, torch.float32, None, True)
        assert cfg.use_fused_mhc is None
        assert native._math(torch.zeros(1, 16), cfg) is native  # CPU tensor: native
        assert native._math(torch.zeros(1, 16, device="meta"), cfg) is native

    def test_explicit_choices(self):
        assert native._math(torch.zeros(1), _mhc_module_config(2, 8, torch.float32, True, True)) is fused
        assert native._math(torch.zeros(1), _mhc_module_config(2, 8, torch.float32, False, True)) is native

    def test_fused_without_triton_is_a_clear_error(self, monkeypatch):
        monkeypatch.setattr(fused, "HAVE_TRITON", False)
        with pytest.raises(ValueError, match="use_fused_mhc=True needs triton"):
            _mhc_module_config(2, 8, torch.float32, True, True)
        # None falls back quietly: nothing required, nothing to refuse.
        assert _mhc_module_config(2, 8, torch.float32, None, True).use_fused_mhc is None

    def test_native_saves_fp32_copies_of_the_streams(self):
        # The memory point of the fused path, shown on the reference: its RMS-normalised fp32
        # copy of the streams is kept for backward (the fused path keeps none; checked below).
        assert _saved_stream_copies(native, "cpu", torch.float32)


# --------------------------------------------------------------------------------------------
# CPU: Triton interpreter
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
@interpreter_parent
def test_interpreter_suite_in_subprocess():
    """Run TestFusedKernelsInterpreter under TRITON_INTERPRET=1 in a fresh interpreter."""
    assert_interpreter_suite_passes(__file__, "TestFusedKernelsInterpreter", timeout=900)


@pytest.mark.triton_interpreter_child
class TestFusedKernelsInterpreter:
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    @pytest.mark.parametrize("n,h", [(3, 24), (4, 40)])
    def test_functions_match_float64_formulas(self, n, h):
        _compare_against_float64(T=5, n=n, h=h, dtype=torch.float32, device="cpu", tol=1e-5)

    @pytest.mark.parametrize("impl", [_impl_input, _impl_input_unlinked])
    @pytest.mark.parametrize("n,h", [(3, 24), (4, 40)])
    def test_mhc_input_matches_float64_formulas(self, n, h, impl):
        _compare_against_float64(T=5, n=n, h=h, dtype=torch.float32, device="cpu", tol=1e-5, impl=impl)

    def test_sinkhorn_extremes_finite_and_equal_to_native(self):
        _check_sinkhorn_extremes("cpu")

    def test_weight_gradient_summed_over_token_ranges(self, monkeypatch):
        # dW is reduced over token ranges in parallel; 130 tokens in ranges of 64: three ranges,
        # the last one ragged.
        monkeypatch.setattr(fused, "_GW_TOKENS", 64)
        _compare_against_float64(T=130, n=2, h=8, dtype=torch.float32, device="cpu", tol=1e-5)
        _compare_against_float64(
            T=130, n=2, h=8, dtype=torch.float32, device="cpu", tol=1e-5, impl=_impl_input
        )

    def test_weight_gradient_ranges_not_a_multiple_of_the_tile(self, monkeypatch):
        # Ranges of 40 tokens against tiles of 64: each range must stop at its own end, or the
        # rows a tile reads past it are counted by two ranges.
        assert fused._GW_BT % 40 != 0
        monkeypatch.setattr(fused, "_GW_TOKENS", 40)
        for impl in (_impl_all, _impl_input):
            _compare_against_float64(
                T=130, n=2, h=8, dtype=torch.float32, device="cpu", tol=1e-5, impl=impl
            )

    def test_modules_fused_equal_native(self):
        # Both sides are float32 and sum in different orders: the scalar alpha gradients are sums
        # with cancellation, which differ by up to ~2e-5 relative between triton releases (3.9.0:
        # 1.4e-5). A wrong kernel is off by orders of magnitude more; the float64 references above
        # keep the tight bound.
        _modules_fused_vs_native(n=3, h=24, s=3, b=2, dtype=torch.float32, device="cpu", tol=5e-5)

    def test_fused_saves_no_copies_of_the_streams(self):
        assert _saved_stream_copies(fused, "cpu", torch.float32) == []


# --------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------
@pytest.mark.gpu
class TestFusedKernelsOnGPU:  # run on the H200
    def setup_method(self, method):
        Utils.initialize_model_parallel(1, 1)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    # fp32: summation order differs from cuBLAS/torch over n*h = 8192 terms (seen: 4e-5 on dx,
    # 1.6e-4 on the scalar alpha_post gradient, a cancelling sum over tokens).
    @pytest.mark.parametrize("dtype,tol", [(torch.float32, 5e-4), (torch.bfloat16, 2e-2)])
    @pytest.mark.parametrize("n,h", [(4, 2048), (3, 200)])
    def test_functions_match_float64_formulas(self, dtype, tol, n, h):
        _compare_against_float64(T=37, n=n, h=h, dtype=dtype, device="cuda", tol=tol)

    @pytest.mark.parametrize("impl", [_impl_input, _impl_input_unlinked])
    @pytest.mark.parametrize("dtype,tol", [(torch.float32, 5e-4), (torch.bfloat16, 2e-2)])
    @pytest.mark.parametrize("n,h", [(4, 2048), (3, 200)])
    def test_mhc_input_matches_float64_formulas(self, dtype, tol, n, h, impl):
        _compare_against_float64(T=37, n=n, h=h, dtype=dtype, device="cuda", tol=tol, impl=impl)

    def test_weight_gradient_summed_over_token_ranges(self, monkeypatch):
        # several token ranges of the dW reduction, the last one ragged, at a real hidden size
        monkeypatch.setattr(fused, "_GW_TOKENS", 64)
        for impl in (_impl_all, _impl_input):
            _compare_against_float64(
                T=150, n=4, h=256, dtype=torch.float32, device="cuda", tol=5e-4, impl=impl
            )

    def test_weight_gradient_ranges_not_a_multiple_of_the_tile(self, monkeypatch):
        # ranges of 100 tokens against tiles of 64 (see the interpreter test of the same name)
        monkeypatch.setattr(fused, "_GW_TOKENS", 100)
        for impl in (_impl_all, _impl_input):
            _compare_against_float64(
                T=250, n=4, h=256, dtype=torch.float32, device="cuda", tol=5e-4, impl=impl
            )

    def test_sinkhorn_extremes_finite_and_equal_to_native(self):
        _check_sinkhorn_extremes("cuda")

    @pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
    def test_modules_fused_equal_native(self, dtype, tol):
        _modules_fused_vs_native(n=4, h=1024, s=64, b=2, dtype=dtype, device="cuda", tol=tol)

    def test_fused_saves_no_copies_of_the_streams_bf16(self):
        assert _saved_stream_copies(fused, "cuda", torch.bfloat16) == []
        assert _saved_stream_copies(native, "cuda", torch.bfloat16)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_gpt_step_fused_default_equals_native(self, dtype):
        from tests.unit_tests.models.gpt.test_gpt_model_moe_mtp_cpu import (
            build_gpt,
            causal_batch,
            tiny_moe_mtp_config,
        )

        results = {}
        for flag in (None, False):
            torch.manual_seed(0)
            cfg = tiny_moe_mtp_config(
                enable_mhc_connections=True, mhc_num_residual_streams=4, hidden_dropout=0.0,
                attention_dropout=0.0, bf16=dtype == torch.bfloat16, params_dtype=dtype,
                use_cpu_initialization=True, use_fused_mhc=flag, hidden_size=64,
            )  # fmt: skip
            model = build_gpt(cfg).cuda().to(dtype)
            tokens, position_ids, mask = (t.cuda() for t in causal_batch())
            x = torch.zeros(1, 4 * 64, device="cuda", dtype=dtype)
            assert (native._math(x, cfg) is fused) == (flag is None)
            loss = model(tokens, position_ids, mask, labels=tokens).float().mean()
            loss.backward()
            results[flag] = (loss.detach(), {k: p.grad.float() for k, p in model.named_parameters()})
        (lf, gf), (ln, gn) = results[None], results[False]
        fp32 = dtype == torch.float32
        torch.testing.assert_close(lf, ln, rtol=1e-4 if fp32 else 2e-2, atol=0)
        assert all(torch.isfinite(g).all() for g in gf.values())
        flat_f, flat_n = (torch.cat([g[k].flatten() for k in sorted(gn)]) for g in (gf, gn))
        assert _rel(flat_f, flat_n) < (1e-4 if fp32 else 3e-2)
        if fp32:  # per tensor too; a floor for scalars whose gradient is a cancelling sum
            floor = 1e-6 * float(flat_n.norm())
            for k in gn:
                err = float((gf[k] - gn[k]).norm()) / max(float(gn[k].norm()), floor)
                assert err < 1e-3, (k, err)
