#!/usr/bin/env bash
# Batches for a GPU host (Transformer Engine importable from /tmp/site): checks, TE tests, the GPU suite, kernels, benches, mutants.
# Usage: bash bench/te_gpu_batch.sh STEP...   (bench: ROUNDS, STEPS, LEAD_IN, BATCH, HIDDEN, HEADS, ONLY, NO_RC,
#   PROFILE; +-2% on one H200: ROUNDS=50 STEPS=3 LEAD_IN=2; +-0.5-1% in 6-10 rounds at HIDDEN=4096 HEADS=32)
#   with STEP in: check, te-tests, suite (or suite-fusions + suite-rest), kernels, smoke, bench, phases, upstream-tests, prove, mutants
#   (phases: PHASE_CONFIGS, default "upstream/rc fork/rc"; BATCH, HIDDEN, HEADS as for bench)
# Results go under $OUT (default ./out). Needs megatron/ and .upstream/ (the pristine sdist tree);
# upstream-tests also needs .upstream-tests/ (upstream's tests/, git archive of the commit closest to the pin);
# mutants needs the pinned sdist in .upstream/cache/sdist/ (MUTANT_GROUPS: space-separated groups of patch
# numbers/names, one prove --mutants --record each, proof.json copied to $OUT after each).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD:/tmp/site:${PYTHONPATH:-} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The pristine upstream tree the fork is compared with. For the upstream-main line: build its trees
# here with `bash bench/line_trees.sh MIRROR`, carry .linetree and .upstream-main, copy
# .linetree/megatron over megatron/ on the GPU host (pytest and the bench import the checkout's
# megatron/ first) and set UPSTREAM_TREE=.upstream-main.
UP=${UPSTREAM_TREE:-.upstream/megatron_core-0.19.2}
TE_TESTS="tests/unit_tests/transformer/moe/test_router_replay_other_checkpoints.py
 tests/unit_tests/dist_checkpointing/test_te_extra_state_checkpoint_gpu.py
 tests/unit_tests/transformer/test_hyper_connection_te.py
 tests/unit_tests/extensions/test_te_parallel_mode_tags.py
 tests/unit_tests/transformer/moe/test_int4_fake_qat.py
 tests/unit_tests/transformer/test_post_sublayer_norm.py
 tests/unit_tests/transformer/test_multi_token_prediction_output_layer_detach.py"
UPSTREAM_TEST_FILES=${UPSTREAM_TEST_FILES:-"tests/unit_tests/transformer/test_multi_token_prediction.py tests/unit_tests/transformer/test_transformer_layer.py tests/unit_tests/transformer/test_transformer_block.py tests/unit_tests/models/test_gpt_model.py tests/unit_tests/transformer/moe/test_moe_layer.py tests/unit_tests/transformer/moe/test_routers.py tests/unit_tests/transformer/moe/test_token_dispatcher.py tests/unit_tests/transformer/moe/test_grouped_mlp.py tests/unit_tests/transformer/moe/test_router_replay.py tests/unit_tests/dist_checkpointing/test_optimizer.py tests/unit_tests/tensor_parallel/test_layers.py"}
for step in "$@"; do
  echo "=== $step $(date +%T)"
  case $step in
    check)
      python3 -c "import torch, transformer_engine as te; from megatron.core.extensions import transformer_engine as x; print('torch', torch.__version__, 'TE', te.__version__, 'HAVE_TE', x.HAVE_TE, torch.cuda.get_device_name(0))" 2>&1 | grep -v JAX | tail -3 ;;
    te-tests)
      timeout ${TE_TESTS_TIMEOUT:-240} python3 -m pytest $TE_TESTS -m gpu -p no:cacheprovider -rA -q -x 2>&1 \
        | tee "$OUT/te-tests.log" | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed|Error" | tail -40 ;;
    suite|suite-fusions|suite-rest)
      # With TE the whole suite takes ~9.5 min on one H200, more than one 600 s call: suite-fusions
      # (the MLA RoPE kernel grid, ~400 s) and suite-rest (~170 s) split it in two calls.
      paths=tests part=; [ "$step" = suite-fusions ] && paths=tests/unit_tests/fusions
      [ "$step" = suite-rest ] && part=--ignore=tests/unit_tests/fusions
      GPU_SUITE_PATHS=$paths timeout ${SUITE_TIMEOUT:-480} bash tests/run_gpu_suite.sh $part 2>&1 | tee "$OUT/$step.log" \
        | grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" | tail -40 ;;
    kernels)
      # The mHC kernels at the bench model's shape: the shipped launch shapes, then the candidate
      # combine backward (bench/experiments/mhc_post_bwd_candidates.py) against the shipped one. No TE needed.
      timeout ${KERNELS_TIMEOUT:-240} python3 bench/mhc_kernels.py --tokens 16384 --impls fused --sweep 2>&1 \
        | grep -v -i warn | tee "$OUT/mhc-kernels.txt" | tail -30
      timeout ${KERNELS_TIMEOUT:-240} python3 bench/experiments/mhc_post_bwd_candidates.py --tokens 16384 2>&1 \
        | grep -v -i warn | tee "$OUT/mhc-post-bwd-candidates.txt" | tail -12 ;;
    smoke)
      timeout ${SMOKE_TIMEOUT:-150} python3 bench/te_bench.py --upstream $UP --layers 2 --hidden 256 --heads 4 \
        --seq 256 --batch 2 --vocab 1024 --steps 2 --rounds 1 --warmup-max 4 --log-dir /tmp/smoke \
        --json "$OUT/smoke.json" 2>&1 | tail -25
      ;;
    bench)
      # ONLY: comparisons to run (e.g. "fork-vs-upstream"); NO_RC=1 leaves out the full-recompute group.
      timeout ${BENCH_TIMEOUT:-540} python3 bench/te_bench.py --upstream $UP --rounds ${ROUNDS:-10} --steps ${STEPS:-8} \
        --batch ${BATCH:-4} ${HIDDEN:+--hidden $HIDDEN} ${HEADS:+--heads $HEADS} ${ONLY:+--only $ONLY} ${NO_RC:+--no-recompute} --lead-in ${LEAD_IN:-3} --warmup-max 20 ${PROFILE:+--profile fork fork+mhc --profile-steps 3} --log-dir /tmp/tb --json "$OUT/te-bench.json" 2>&1 \
        | tee "$OUT/te-bench.log" | tail -45
      cp /tmp/tb/*/profile-*.txt "$OUT/" 2>/dev/null ;;
    phases)
      # Where each configuration's step peaks (forward or backward) and what is live then.
      timeout ${PHASES_TIMEOUT:-300} python3 bench/te_peak_phases.py --upstream $UP --batch ${BATCH:-4} \
        ${HIDDEN:+--hidden $HIDDEN} ${HEADS:+--heads $HEADS} --configs ${PHASE_CONFIGS:-upstream/rc fork/rc} \
        --trace --log-dir /tmp/phases --json "$OUT/phases.json" 2>&1 | grep -v -i warn | tee "$OUT/phases.log" | tail -40 ;;
    upstream-tests)
      # Upstream's own unit tests with TE, fork vs pristine upstream, side by side on the GPU; each side
      # sees only its own megatron/ (a one-entry folder on PYTHONPATH) and upstream's tests/ as cwd.
      mkdir -p /tmp/side-fork /tmp/side-upstream
      ln -sfn "$PWD/megatron" /tmp/side-fork/megatron; ln -sfn "$PWD/$UP/megatron" /tmp/side-upstream/megatron
      port=29611
      for side in fork upstream; do
        (cd .upstream-tests && MASTER_PORT=$port PYTHONPATH=/tmp/side-$side:/tmp/site timeout ${UT_TIMEOUT:-420} \
          python3 -m pytest $UPSTREAM_TEST_FILES -p no:cacheprovider -q --continue-on-collection-errors --junitxml="$OUT/ut-$side.xml" \
          > "$OUT/ut-$side.log" 2>&1) &
        port=$((port + 1))
      done
      wait
      tail -n 3 "$OUT/ut-fork.log" "$OUT/ut-upstream.log"
      python3 bench/junit_compare.py "$OUT/ut-fork.xml" "$OUT/ut-upstream.xml" | tee "$OUT/ut-compare.txt" | tail -40 ;;
    prove|mutants)
      # prove (--record) or prove --mutants (--record, group by group) on the GPU host's cores, in
      # CI's environment: no CUDA device and no TE visible. Every Tests: id but the gpu-marked ones is
      # a CPU test, and with TE importable the fork's code picks other layer specs than those tests
      # were written for (on the first try here most baselines failed that way). GPU-marked ids skip.
      args="--jobs ${JOBS:-16}"; [ "$step" = mutants ] && args="--mutants ${MUTANTS:-8} $args"
      groups=${MUTANT_GROUPS:-all}; [ "$step" = prove ] && groups=all
      for group in $groups; do
        [ "$group" = all ] && group=
        # MUTANT_GPU=1: keep the GPU visible (patches whose Tests: are the gpu-marked kernel tests).
        hide=CUDA_VISIBLE_DEVICES=; [ -n "${MUTANT_GPU:-}" ] && hide=
        env $hide OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 FORK_REBASE_CACHE=$PWD/.upstream/cache \
          PYTHONPATH= timeout ${PROVE_TIMEOUT:-560} python3 -m tools.rebase prove $args --record ${group//,/ } \
          2>&1 | tee -a "$OUT/$step.log" | grep -v "^mutants: [0-9]" | tail -60
        cp patches/proof.json "$OUT/proof.json"
      done ;;
  esac
done
