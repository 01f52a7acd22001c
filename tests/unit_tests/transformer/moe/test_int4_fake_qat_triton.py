"""The fused int4 quantize-dequantize kernel (megatron/core/transformer/moe/int4_fake_qat_triton.py).

The kernel must equal the torch reference ``int4_fake_qat.int4_quantize_dequantize`` bit for bit
(that is why no config switch selects it). The weights here are built to hit what an inexact kernel
gets wrong: quotients exactly on .5 (round half to even), fp32 quotients one ulp either side of .5
(an approximate division lands on the wrong side), all-zero groups and tiny groups (the 1e-5
scale floor), ragged last groups, groups wider than the kernel's column block, NaN and inf. Every
bf16 case also checks the final cast (a truncating one, as the interpreter's own, differs at once;
exact bf16 ties cannot occur: q * fl(amax / 7) for bf16 amax never ends in 0x8000, by search).

CPU: the kernel runs in Triton's interpreter in a child process (``TRITON_INTERPRET=1`` must be set
before triton loads). GPU (``gpu`` marker): the same on CUDA at the bench model's expert shapes, and
through ``TEGroupedLinear`` when Transformer Engine is importable.
"""

import pytest
import torch

pytest.importorskip("triton")

from megatron.core.transformer.moe import int4_fake_qat as qat
from megatron.core.transformer.moe import int4_fake_qat_triton as fused
from tests.unit_tests.triton_interpreter import assert_interpreter_suite_passes, interpreter_parent

LEVEL = qat.INT4_MAX_LEVEL


def kernel(weight, group_size):
    return fused.int4_quantize_dequantize_triton(weight, group_size, LEVEL, qat.MIN_SCALE)


def assert_bit_identical(actual, expected):
    """Same dtype, shape and bits; NaN only where the reference has NaN (payloads may differ)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert actual.is_contiguous()
    nan = torch.isnan(expected)
    assert torch.equal(torch.isnan(actual), nan)
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[actual.element_size()]
    a, e = actual[~nan].view(bits), expected[~nan].view(bits)
    mismatches = (a != e).nonzero().flatten()
    assert mismatches.numel() == 0, (
        f"{mismatches.numel()} of {a.numel()} elements differ, first at flat index "
        f"{mismatches[0].item()}: {actual[~nan][mismatches[0]].item()!r} vs "
        f"{expected[~nan][mismatches[0]].item()!r}"
    )


def crafted_weight(rows, cols, group, dtype, device="cpu", seed=0):
    """Random weights whose first groups, row by row, carry the hard cases (see module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen) * 0.05
    g = min(group, cols)
    steps = torch.arange(-LEVEL, LEVEL, dtype=torch.float32) + 0.5  # -6.5 .. 6.5
    for r in range(rows):
        kind = r % 5
        if kind == 0:  # an all-zero first group (and a negative zero in it)
            w[r, :g] = 0.0
            w[r, min(1, g - 1)] = -0.0
        elif kind == 1:  # tiny: absmax / 7 far below the 1e-5 floor
            w[r, :g] = torch.randn(g, generator=gen) * 1e-6
        elif kind == 2:  # exact ties: scale a power of two, quotients k + 0.5
            scale = 2.0 ** -(6 + r % 4)
            vals = torch.cat([torch.tensor([LEVEL * 1.0]), steps])
            w[r, :g] = vals.repeat(g // vals.numel() + 1)[:g] * scale
            w[r, 0] = LEVEL * scale  # the absmax is exactly 7 * scale
        elif kind == 3 and dtype == torch.float32:  # one ulp either side of k + 0.5
            amax = torch.rand(1, generator=gen) * 0.9 + 0.05
            scale = (amax.to(device) / LEVEL).cpu()  # the reference's scale on that device
            ties = steps * scale
            near = torch.stack([torch.nextafter(ties, ties + 1), torch.nextafter(ties, ties - 1), ties])
            vals = torch.cat([amax, near.flatten()])
            w[r, :g] = vals.repeat(g // vals.numel() + 1)[:g]
            w[r, 0] = amax
        elif kind == 4:  # the absmax in the group's last column (past the first column block)
            w[r, g - 1] = -3 * w[r, :g].abs().max()
    return w.to(dtype).to(device)


SHAPES = [  # rows, cols, group: ragged last groups, 32 / 128 / non-power-of-two, whole-row groups
    (10, 70, 32),
    (7, 300, 128),
    (11, 150, 48),
    (5, 96, 96),
    (6, 40, 1000),
    (5, 2100, 1500),  # a group wider than the kernel's 1024-column block: walked in two chunks
]


def check_against_reference(rows, cols, group, dtype, device):
    w = crafted_weight(rows, cols, group, dtype, device)
    assert_bit_identical(kernel(w, group), qat.int4_quantize_dequantize(w, group))


def check_non_finite(dtype, device):
    w = crafted_weight(4, 64, 32, dtype, device)
    w[0, 3] = float("nan")  # the whole group turns NaN
    w[1, 40] = float("inf")  # scale inf: finite entries become 0, the inf NaN
    w[2, 5] = float("-inf")
    assert_bit_identical(kernel(w, 32), qat.int4_quantize_dequantize(w, 32))


def check_strided_input(device):
    base = crafted_weight(90, 12, 32, torch.bfloat16, device)
    w = base.t()  # [12, 90], column stride 12
    assert not w.is_contiguous()
    assert_bit_identical(kernel(w, 32), qat.int4_quantize_dequantize(w, 32))


def check_straight_through_uses_the_kernel(monkeypatch, device):
    calls = []
    real = fused.int4_quantize_dequantize_triton

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(fused, "int4_quantize_dequantize_triton", counting)
    if device == "cpu":  # the dispatcher takes CUDA tensors only; the interpreter runs on CPU
        monkeypatch.setattr(fused, "fused_kernel_applies", lambda weight, max_level: True)
    weight = crafted_weight(9, 50, 16, torch.float32, device).requires_grad_()
    out = qat.int4_fake_quantize(weight, 16)
    assert calls == [weight.shape]
    assert_bit_identical(out.detach(), qat.int4_quantize_dequantize(weight, 16))
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    assert torch.equal(weight.grad, grad_out)


class Marker(torch.Tensor):
    """A tensor subclass, as quantized or distributed parameter types are."""


def grouped_kernel(weights, group_size):
    return fused.int4_quantize_dequantize_triton_grouped(weights, group_size, LEVEL, qat.MIN_SCALE)


def check_grouped_against_reference(rows, cols, group, dtype, device, experts=3, transpose=False):
    """One launch over several experts' weights: each slice equals the reference of its weight."""
    weights = [crafted_weight(rows, cols, group, dtype, device, seed=e) for e in range(experts)]
    if transpose:  # strided: the launch walks every weight with the first one's strides
        weights = [crafted_weight(cols, rows, group, dtype, device, seed=e).t() for e in range(experts)]
    images = grouped_kernel(weights, group)
    assert images.shape == (experts, rows, cols) and images.dtype == dtype
    for w, image in zip(weights, images.unbind(0)):
        assert_bit_identical(image, qat.int4_quantize_dequantize(w, group))


def check_group_straight_through(monkeypatch, device):
    """A grouped linear's weights: one grouped launch, the reference's bits, identity gradients."""
    launches = []
    real = fused.int4_quantize_dequantize_triton_grouped

    def counting(weights, *args, **kwargs):
        launches.append(len(weights))
        return real(weights, *args, **kwargs)

    monkeypatch.setattr(fused, "int4_quantize_dequantize_triton_grouped", counting)
    if device == "cpu":
        monkeypatch.setattr(fused, "fused_kernel_applies", lambda weight, max_level: True)
    weights = [crafted_weight(9, 50, 16, torch.float32, device, seed=e).requires_grad_() for e in range(4)]
    images = qat.int4_fake_quantize_group(weights, 16)
    assert launches == [4]
    grads = [torch.randn_like(image) for image in images]
    torch.autograd.backward(images, grads)
    for w, image, g in zip(weights, images, grads):
        assert_bit_identical(image.detach(), qat.int4_quantize_dequantize(w, 16))
        assert torch.equal(w.grad, g)


def reference_scaled_by_reciprocal(weight, group_size):
    """The torch reference as CUDA torch evaluates it: ``amax / 7`` as ``amax * fl(1/7)``."""
    rows, cols = weight.shape
    w = torch.nn.functional.pad(weight.float(), (0, (-cols) % group_size)).reshape(rows, -1, group_size)
    inverse = float(torch.tensor(1.0 / LEVEL, dtype=torch.float32))
    scale = (w.abs().amax(dim=-1, keepdim=True) * inverse).clamp(min=qat.MIN_SCALE)
    q = torch.round(w / scale).clamp(-LEVEL, LEVEL) * scale
    return q.reshape(rows, -1)[:, :cols].to(weight.dtype).contiguous()


# --------------------------------------------------------------------------------------------
# CPU, without the interpreter
# --------------------------------------------------------------------------------------------
class TestDispatch:
    def test_cpu_weights_take_the_torch_reference(self, monkeypatch):
        def fail(*args, **kwargs):
            raise AssertionError("the fused kernel ran on a CPU weight")

        monkeypatch.setattr(fused, "int4_quantize_dequantize_triton", fail)
        w = crafted_weight(5, 40, 16, torch.bfloat16)
        assert not fused.fused_kernel_applies(w, LEVEL)
        assert_bit_identical(qat.int4_fake_quantize(w, 16), qat.int4_quantize_dequantize(w, 16))

    def test_bad_input_is_rejected_before_any_kernel(self, monkeypatch):
        monkeypatch.setattr(fused, "fused_kernel_applies", lambda weight, max_level: True)
        with pytest.raises(ValueError, match="2-D"):
            qat.int4_fake_quantize(torch.zeros(2, 3, 4), 16)
        with pytest.raises(ValueError, match="group size"):
            qat.int4_fake_quantize(torch.zeros(2, 3), 0)

    def test_unsupported_dtype_and_missing_triton_are_clear_errors(self, monkeypatch):
        with pytest.raises(TypeError, match="float64"):
            kernel(torch.zeros(2, 3, dtype=torch.float64), 16)
        monkeypatch.setattr(fused, "HAVE_TRITON", False)
        with pytest.raises(RuntimeError, match="needs triton"):
            kernel(torch.zeros(2, 3), 16)

    def test_cpu_torch_divides_correctly_rounded(self):
        # The reference's amax / 7 on CPU; the kernel follows whatever the device's torch does.
        assert fused.torch_level_division("cpu", LEVEL) == "divide"

    def test_weights_of_different_layouts_are_quantized_one_by_one(self, monkeypatch):
        # The grouped launch walks every weight with the first one's shape and strides: weights
        # that differ in either (or in dtype) must not share it. Stand-ins record the calls.
        one, grouped = [], []
        monkeypatch.setattr(fused, "fused_kernel_applies", lambda weight, max_level: True)
        monkeypatch.setattr(fused, "int4_quantize_dequantize_triton",
                            lambda w, g, *a: one.append(tuple(w.shape)) or qat.int4_quantize_dequantize(w, g))
        monkeypatch.setattr(fused, "int4_quantize_dequantize_triton_grouped",
                            lambda ws, *a: grouped.append(len(ws)))  # fmt: skip
        a, b = torch.randn(4, 32), torch.randn(4, 64)
        images = qat.int4_fake_quantize_group([a, b], 16)
        assert one == [(4, 32), (4, 64)] and grouped == []
        assert_bit_identical(images[1], qat.int4_quantize_dequantize(b, 16))
        qat.int4_fake_quantize_group([a, torch.randn(32, 4).t()], 16)  # same shape, other strides
        qat.int4_fake_quantize_group([a, a.to(torch.bfloat16)], 16)
        qat.int4_fake_quantize_group([a], 16)  # a single weight needs no table
        assert grouped == [] and len(one) == 7

    def test_grouped_kernel_refuses_mixed_layouts_and_nothing(self):
        with pytest.raises(ValueError, match=r"one shape, stride, dtype and device, got \(4, 32\)"):
            grouped_kernel([torch.zeros(4, 32), torch.zeros(4, 16)], 16)
        with pytest.raises(ValueError, match="at least one weight"):
            grouped_kernel([], 16)

    def test_grouped_path_checks_every_weight_first(self, monkeypatch):
        monkeypatch.setattr(fused, "fused_kernel_applies", lambda weight, max_level: True)
        with pytest.raises(TypeError, match="plain high-precision weight"):
            qat.int4_fake_quantize_group([torch.zeros(2, 8), torch.nn.Parameter(torch.zeros(2, 8)).data.as_subclass(Marker)], 8)
        with pytest.raises(ValueError, match="group size"):
            qat.int4_fake_quantize_group([torch.zeros(2, 8), torch.zeros(2, 8)], 0)

    def test_address_table_is_made_once_per_set_of_weights(self):
        ws = [torch.randn(3, 8) for _ in range(3)]
        table = fused._address_table(ws)
        assert table.dtype == torch.int64 and table.tolist() == [w.data_ptr() for w in ws]
        assert fused._address_table(ws) is table
        other = fused._address_table(ws[::-1])
        assert other is not table and other.tolist() == [w.data_ptr() for w in ws[::-1]]

    def test_unknown_division_is_refused(self, monkeypatch):
        monkeypatch.setattr(fused, "torch_level_division", lambda device_type, max_level: None)
        with pytest.raises(RuntimeError, match="cannot reproduce"):
            kernel(torch.zeros(2, 3), 16)


# --------------------------------------------------------------------------------------------
# CPU: Triton interpreter
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
@interpreter_parent
def test_interpreter_suite_in_subprocess():
    """Run TestInt4KernelInterpreter under TRITON_INTERPRET=1 in a fresh interpreter."""
    assert_interpreter_suite_passes(__file__, "TestInt4KernelInterpreter", timeout=600)


@pytest.mark.triton_interpreter_child
class TestInt4KernelInterpreter:
    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
    @pytest.mark.parametrize("rows,cols,group", SHAPES)
    def test_equals_reference_bit_for_bit(self, rows, cols, group, dtype):
        check_against_reference(rows, cols, group, dtype, "cpu")

    def test_fp16_equals_reference(self):
        check_against_reference(10, 70, 32, torch.float16, "cpu")

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
    def test_nan_and_inf_like_the_reference(self, dtype):
        check_non_finite(dtype, "cpu")

    def test_strided_weight(self):
        check_strided_input("cpu")

    @pytest.mark.parametrize("shape", [(0, 256), (8, 0)])
    def test_an_empty_weight_gives_an_empty_image_without_a_launch(self, shape):
        # No rows or no columns: nothing to quantize, and a zero-width grid must not be launched.
        out = kernel(torch.empty(shape, dtype=torch.bfloat16), 128)
        assert out.shape == shape and out.dtype == torch.bfloat16 and out.is_contiguous()

    def test_straight_through_gradient_through_the_kernel(self, monkeypatch):
        check_straight_through_uses_the_kernel(monkeypatch, "cpu")

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
    @pytest.mark.parametrize("rows,cols,group", SHAPES[:4] + SHAPES[5:])
    def test_grouped_launch_equals_the_reference_for_every_expert(self, rows, cols, group, dtype):
        check_grouped_against_reference(rows, cols, group, dtype, "cpu")

    def test_grouped_launch_of_strided_weights(self):
        check_grouped_against_reference(12, 90, 32, torch.bfloat16, "cpu", transpose=True)

    def test_grouped_straight_through(self, monkeypatch):
        check_group_straight_through(monkeypatch, "cpu")

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
    def test_reciprocal_scale_like_cuda_torch(self, monkeypatch, dtype):
        monkeypatch.setattr(fused, "torch_level_division", lambda device_type, max_level: "reciprocal")
        w = crafted_weight(10, 70, 32, dtype)
        expected = reference_scaled_by_reciprocal(w, 32)
        assert_bit_identical(kernel(w, 32), expected)
        if dtype == torch.float32:  # the two scale roundings differ here (not always after bf16)
            assert not torch.equal(expected, qat.int4_quantize_dequantize(w, 32))


# --------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------
@pytest.mark.gpu
class TestInt4KernelOnGPU:
    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
    @pytest.mark.parametrize(
        "rows,cols,group",
        [(2048, 2048, 128), (4096, 2048, 128), (2048, 1000, 128), (1408, 2048, 96), (512, 2048, 32)]
        + SHAPES,
    )
    def test_equals_reference_bit_for_bit(self, rows, cols, group, dtype):
        check_against_reference(rows, cols, group, dtype, "cuda")

    def test_random_expert_weights(self):
        gen = torch.Generator(device="cuda").manual_seed(3)
        for dtype in (torch.bfloat16, torch.float32):
            w = (torch.randn(8 * 2048, 2048, generator=gen, device="cuda") * 0.02).to(dtype)
            assert_bit_identical(kernel(w, 128), qat.int4_quantize_dequantize(w, 128))

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
    def test_nan_and_inf_like_the_reference(self, dtype):
        check_non_finite(dtype, "cuda")

    def test_strided_weight(self):
        check_strided_input("cuda")

    def test_straight_through_gradient_through_the_kernel(self, monkeypatch):
        check_straight_through_uses_the_kernel(monkeypatch, "cuda")

    def test_torch_division_rule_is_known(self):
        assert fused.torch_level_division("cuda", LEVEL) in ("divide", "reciprocal")

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
    @pytest.mark.parametrize("rows,cols,group", [(2048, 2048, 128), (1408, 2048, 96)] + SHAPES)
    def test_grouped_launch_equals_the_reference_for_every_expert(self, rows, cols, group, dtype):
        check_grouped_against_reference(rows, cols, group, dtype, "cuda", experts=8)

    def test_grouped_launch_of_strided_weights(self):
        check_grouped_against_reference(12, 90, 32, torch.bfloat16, "cuda", transpose=True)

    def test_grouped_straight_through(self, monkeypatch):
        check_group_straight_through(monkeypatch, "cuda")


@pytest.mark.gpu
class TestInt4KernelInTEGroupedLinear:
    """TE's grouped GEMM gets the kernel's weights: the same bits as the reference, the same output."""

    def setup_method(self, method):
        from tests.unit_tests.test_utilities import Utils

        Utils.initialize_model_parallel(1, 1)
        torch.manual_seed(1234)

    def teardown_method(self, method):
        from tests.unit_tests.test_utilities import Utils

        Utils.destroy_model_parallel()

    def test_grouped_weights_and_output_equal_the_reference_path(self, monkeypatch):
        pytest.importorskip("transformer_engine")
        from megatron.core.extensions.transformer_engine import TEColumnParallelGroupedLinear
        from tests.unit_tests.transformer.moe.test_int4_fake_qat import moe_config

        group, hidden, ffn, experts = 128, 1024, 512, 4  # in_features 1024: 8 groups per row
        config = moe_config(
            moe_int4_fake_qat=True,
            moe_int4_fake_qat_group_size=group,
            use_cpu_initialization=False,
            moe_grouped_gemm=True,
            params_dtype=torch.bfloat16,
            bf16=True,
        )
        layer = TEColumnParallelGroupedLinear(
            experts, hidden, ffn, config=config, init_method=torch.nn.init.normal_,
            bias=False, skip_bias_add=False, is_expert=True,
        ).cuda()  # fmt: skip
        stored = [getattr(layer, f"weight{i}") for i in range(experts)]
        assert all(w.dtype == torch.bfloat16 and w.is_cuda for w in stored)
        launches = []
        real = fused.int4_quantize_dequantize_triton_grouped
        monkeypatch.setattr(fused, "int4_quantize_dequantize_triton_grouped",
                            lambda ws, *a: launches.append(len(ws)) or real(ws, *a))  # fmt: skip
        fed = layer._get_weight_tensors()
        assert launches == [experts]  # the experts' weights in one launch
        for w, q in zip(stored, fed):
            assert_bit_identical(q.detach(), qat.int4_quantize_dequantize(w, group))

        m_splits = [96, 32, 16, 112]
        x = torch.randn(sum(m_splits), hidden, device="cuda", dtype=torch.bfloat16)
        grad_out = torch.randn(sum(m_splits), ffn, device="cuda", dtype=torch.bfloat16)

        def step():
            for w in stored:
                w.grad = None
            xi = x.clone().requires_grad_()
            out, _ = layer(xi, m_splits)
            out.backward(grad_out)
            return out.detach(), xi.grad, [w.grad.clone() for w in stored]

        fused_out, fused_dx, fused_dw = step()
        monkeypatch.setattr(fused, "fused_kernel_applies", lambda weight, max_level: False)
        ref_out, ref_dx, ref_dw = step()
        assert_bit_identical(fused_out, ref_out)
        assert_bit_identical(fused_dx, ref_dx)
        for a, b in zip(fused_dw, ref_dw):
            assert_bit_identical(a, b)
