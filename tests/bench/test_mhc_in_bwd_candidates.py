"""The candidate mHC input backward of ``bench/mhc_in_bwd_candidates.py`` gives the shipped kernel's
``dx`` and ``dW`` (Triton's CPU interpreter, small shapes), so a GPU session can time it and adopt
the faster one without first re-checking what it computes."""

import pytest

from tests.unit_tests.triton_interpreter import assert_interpreter_suite_passes, interpreter_parent


@interpreter_parent
def test_candidate_matches_shipped_kernel_in_interpreter():
    assert_interpreter_suite_passes(__file__, "TestCandidateInInterpreter", timeout=600)


@pytest.mark.triton_interpreter_child
class TestCandidateInInterpreter:
    @pytest.mark.parametrize(
        "T, n, h, shapes",
        [
            (64, 4, 32, {}),
            (80, 4, 48, dict(dx_shape=(16, 64, 4), dw_shape=(32, 64, 32, 4))),  # ragged tokens and hidden
            (64, 2, 32, dict(dw_shape=(16, 16, 16, 2))),  # n = 2: C = 8 padded to 16; many token ranges
        ],
    )
    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    def test_dx_and_dw_equal_the_shipped_kernel(self, T, n, h, shapes, dtype):
        import torch

        from bench.mhc_in_bwd_candidates import compare

        for add_gx, (dx_err, dw_err) in compare(T, n, h, getattr(torch, dtype), **shapes).items():
            assert dx_err < 1e-6, (add_gx, dx_err)
            assert dw_err < 1e-5, (add_gx, dw_err)

    def test_a_wrong_candidate_is_caught(self, monkeypatch):
        """The comparison can fail: a dx that drops the combine's gradient is far off."""
        import torch

        import bench.mhc_in_bwd_candidates as cand

        real = cand.candidate
        monkeypatch.setattr(cand, "candidate", lambda a, n, **kw: real(a, n, **{**kw, "add_gx": False}))
        errors = cand.compare(64, 4, 32, torch.float32)
        assert errors[True][0] > 0.1 and errors[False][0] < 1e-6
