"""The candidate mHC combine backward of ``bench/experiments/mhc_post_bwd_candidates.py`` gives the shipped
kernel's ``dx``, ``dH_res``, ``dH_post`` and ``dy`` (Triton's CPU interpreter, small shapes), so a
GPU session can time it and adopt the faster one without first re-checking what it computes."""

import pytest

from tests.unit_tests.triton_interpreter import assert_interpreter_suite_passes, interpreter_parent


@pytest.mark.slow
@interpreter_parent
def test_candidate_matches_shipped_kernel_in_interpreter():
    assert_interpreter_suite_passes(__file__, "TestCandidateInInterpreter", timeout=600)


@pytest.mark.triton_interpreter_child
class TestCandidateInInterpreter:
    @pytest.mark.parametrize(
        "T, n, h, shape",
        [
            (16, 4, 64, (2, 32, 4)),  # several hidden blocks per program
            (13, 4, 48, (4, 32, 4)),  # ragged tokens and hidden
            (8, 3, 32, (1, 32, 2)),  # n = 3: streams padded to 4
        ],
    )
    def test_outputs_equal_the_shipped_kernel(self, T, n, h, shape):
        import torch

        from bench.experiments.mhc_post_bwd_candidates import compare

        errors = compare(T, n, h, torch.float32, shape=shape)
        assert max(errors.values()) < 1e-5, errors

    def test_a_wrong_candidate_is_caught(self, monkeypatch):
        """The comparison can fail: a candidate that reads H_res transposed is far off."""
        import torch

        import bench.experiments.mhc_post_bwd_candidates as cand

        real_candidate = cand.candidate

        def wrong(a, **kw):
            b = dict(a, hr=a["hr"].transpose(1, 2).contiguous())
            return real_candidate(b, **kw)

        monkeypatch.setattr(cand, "candidate", wrong)
        errors = cand.compare(16, 4, 64, torch.float32, shape=(2, 32, 4))
        assert errors["dx"] > 0.05 and errors["dH_post"] < 1e-5
