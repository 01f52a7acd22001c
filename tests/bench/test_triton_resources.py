"""bench/triton_resources.py compiles a Triton kernel for a named GPU architecture on a machine
without one and reads back what the compiler emitted: the same dot is a warpgroup MMA on sm_90
and mma.sync on sm_80, and a kernel that holds too much in registers shows a stack."""

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from tests.unit_tests.triton_interpreter import INTERPRETING  # noqa: E402

pytestmark = pytest.mark.skipif(INTERPRETING, reason="compiles for a GPU target; not in the interpreter")


@triton.jit
def _tile_dot(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b))


SIG = dict(a_ptr="*bf16", b_ptr="*bf16", c_ptr="*fp32")


@pytest.fixture(scope="module")
def tool():
    from bench import triton_resources

    try:
        triton_resources.cuobjdump_path()
    except SystemExit as missing:
        pytest.skip(str(missing))
    return triton_resources


def test_hopper_dot_is_a_warpgroup_mma(tool):
    r = tool.resources(_tile_dot, SIG, dict(M=64, N=64, K=64), num_warps=4, arch=90)
    assert r["wgmma"] > 0 and r["mma.sync"] == 0, r
    assert 0 < r["registers"] <= 255 and r["stack"] == 0 and r["shared"] > 0, r


def test_ampere_dot_is_mma_sync(tool):
    r = tool.resources(_tile_dot, SIG, dict(M=64, N=64, K=64), num_warps=4, arch=80)
    assert r["wgmma"] == 0 and r["mma.sync"] > 0, r


def test_a_tile_too_large_for_the_registers_spills(tool):
    """One warp holding a 256 x 256 fp32 result cannot keep it in 255 registers a thread."""
    r = tool.resources(_tile_dot, SIG, dict(M=256, N=256, K=32), num_warps=1, arch=90)
    assert r["stack"] > 0, r
