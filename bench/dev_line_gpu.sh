#!/usr/bin/env bash
# The upstream-dev line on a GPU host, against pristine upstream dev: dev's own unit tests on both
# trees compared per test, the line's whole suite, and the mHC step bench.
#
# Here (CPU, with a mirror):  bash bench/dev_line_gpu.sh pack MIRROR
#   writes .devgpu.tar.gz (git-ignored, about 10 MiB): the line's tree, the same with the split
#   projection backward, pristine dev's megatron/ and dev's tests/, all at the line's pin.
# On the GPU host (Transformer Engine in /tmp/site, docs/maintaining.md#device-runs), carrying
# .devgpu.tar.gz:  bash bench/dev_line_gpu.sh STEP...   with STEP in
#   dev-tests         dev's test files (DEV_TEST_FILES) on the line and on dev, SHARDS pytest
#                     processes a side, then bench/junit_compare.py: every test whose outcome differs
#   dev-kernel-tests  dev's tests/unit_tests/fusions/test_fused_mhc_kernels.py the same way
#   suite             the line's whole suite (every file its Tests: name, plus tests/integration)
#   mla-repeats       the MLA fused-vs-unfused RoPE test body repeated (python -m bench mla_rope_repeats)
#   bench             te_bench: dev's mHC step and the plain step, line / dev, at HIDDEN (4096),
#                     ROUNDS (6); SCHEDULE=split measures the line with the split projection backward
#   sweep             proj_block_sweep: both backward schedules and their tiles at HIDDEN
# Results go under $OUT (default ./out). Each step fits one 600 s call on one H100/H200.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
PACK=.devgpu.tar.gz TREES=.devgpu
DEV_TEST_FILES=${DEV_TEST_FILES:-"tests/unit_tests/transformer/test_multi_token_prediction.py
 tests/unit_tests/transformer/test_hyper_connection_recompute.py
 tests/unit_tests/transformer/test_mhc_block_manager.py
 tests/unit_tests/transformer/moe/test_router_replay.py
 tests/unit_tests/transformer/moe/test_routers.py
 tests/unit_tests/transformer/test_transformer_layer.py
 tests/unit_tests/pipeline_parallel/test_pp_mhc_compatibility.py
 tests/unit_tests/a2a_overlap/test_mhc_schedule.py
 tests/unit_tests/models/test_gpt_model.py
 tests/unit_tests/transformer/moe/test_moe_layer.py
 tests/unit_tests/transformer/moe/test_token_dispatcher.py
 tests/unit_tests/distributed/test_param_and_grad_buffer.py
 tests/unit_tests/dist_checkpointing/test_optimizer.py"}
KERNEL_TEST_FILES=tests/unit_tests/fusions/test_fused_mhc_kernels.py

pack() {
  local mirror=${1:?usage: bash bench/dev_line_gpu.sh pack MIRROR (a local clone of NVIDIA/Megatron-LM)}
  local commit
  commit=$(python3 -c "import sys; from pathlib import Path; from tools.rebase.stack.pin import load_pin; print(load_pin(Path(sys.argv[1])).commit)" lines/upstream-dev/upstream.toml) || exit 1
  rm -rf "$TREES" "$PACK" && mkdir -p "$TREES"/line "$TREES"/dev "$TREES"/devtests || exit 1
  python3 -m tools.rebase tree --line upstream-dev --mirror "$mirror" "$TREES/line" || exit 1
  cp -r "$TREES/line" "$TREES/line-split"
  sed -i 's/^_PROJ_BWD_SCHEDULE = "fused"$/_PROJ_BWD_SCHEDULE = "split"/' \
    "$TREES/line-split/megatron/core/transformer/hyper_connection_fused.py"
  grep -q '^_PROJ_BWD_SCHEDULE = "split"$' "$TREES/line-split/megatron/core/transformer/hyper_connection_fused.py" \
    || { echo "pack: the line's _PROJ_BWD_SCHEDULE default is not \"fused\"; line-split not made"; exit 1; }
  git -C "$mirror" archive "$commit" -- megatron | tar -x -C "$TREES/dev" || exit 1
  git -C "$mirror" archive "$commit" -- tests/__init__.py tests/test_utils tests/unit_tests | tar -x -C "$TREES/devtests" || exit 1
  tar -czf "$PACK" "$TREES" && rm -rf "$TREES"
  echo "pack: $PACK ($(du -h "$PACK" | cut -f1)): line, line-split, dev ($commit), dev's tests"
}

unpack() { [ -d "$TREES" ] || tar -xzf "$PACK" || { echo "no $PACK: run 'pack MIRROR' first and carry it"; exit 1; }; }

# pytest on the node ids listed in a file (one a line; an id may hold spaces), then the other args.
RUN_IDS='import sys, pytest; ids = [l for l in open(sys.argv[1]).read().splitlines() if l]; sys.exit(pytest.main(ids + sys.argv[2:]))'

# Dev's tests once per side: the side's megatron/ alone first on PYTHONPATH, dev's tests/ as cwd,
# SHARDS pytest processes (the collected ids dealt round robin), each with its own NCCL port and its
# own --basetemp: dev's tmp_path_dist_ckpt is the basetemp's grandparent, so processes sharing one
# overwrite each other's checkpoints (3 of test_chunked_offload_distributed_checkpoint_compatibility
# failed that way under xdist, h100-dev-own-tests.txt).
dev_tests() {
  local name=$1 files=$2 shards=${SHARDS:-2} port=29700
  unpack
  for side in line dev; do
    mkdir -p "/tmp/side-$side" && ln -sfn "$PWD/$TREES/$side/megatron" "/tmp/side-$side/megatron"
    (cd "$TREES/devtests" && PYTHONPATH=/tmp/side-$side:/tmp/site python3 -m pytest $files --collect-only -q \
      -p no:cacheprovider > "$OUT/$name-$side.collect" 2>&1)
    grep '::' "$OUT/$name-$side.collect" > "$OUT/$name-$side.ids"
    if [ ! -s "$OUT/$name-$side.ids" ]; then
      # dev's tests/unit_tests/conftest.py imports click and requests (its dataset download).
      echo "dev_line_gpu: no test of $files collected on the $side tree:"; tail -n 15 "$OUT/$name-$side.collect"
      return 1
    fi
    for i in $(seq 0 $((shards - 1))); do
      awk -v n="$shards" -v i="$i" 'NR % n == i' "$OUT/$name-$side.ids" > "$OUT/$name-$side-$i.ids"
      (cd "$TREES/devtests" && MASTER_PORT=$port PYTHONPATH=/tmp/side-$side:/tmp/site timeout ${UT_TIMEOUT:-540} \
        python3 -c "$RUN_IDS" "$OUT/$name-$side-$i.ids" -p no:cacheprovider -q --basetemp="/tmp/bt-$name-$side-$i/base" \
        --junitxml="$OUT/$name-$side-$i.xml" > "$OUT/$name-$side-$i.log" 2>&1) &
      port=$((port + 1))
    done
  done
  wait
  tail -qn 1 "$OUT"/$name-*.log
  local line_xml dev_xml
  line_xml=$(ls "$OUT"/$name-line-*.xml | paste -sd,) dev_xml=$(ls "$OUT"/$name-dev-*.xml | paste -sd,)
  python3 bench/junit_compare.py "$line_xml" "$dev_xml" | tee "$OUT/$name-compare.txt" | tail -40
}

[ "${1:-}" = pack ] && { shift; pack "$@"; exit; }
export PYTHONPATH=$PWD:/tmp/site:${PYTHONPATH:-} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for step in "$@"; do
  echo "=== $step $(date +%T)"
  case $step in
    dev-tests) dev_tests dev-tests "$DEV_TEST_FILES" ;;
    dev-kernel-tests) SHARDS=${SHARDS:-4} dev_tests dev-kernel-tests "$KERNEL_TEST_FILES" ;;
    suite)
      # pytest imports the checkout's megatron/ first: make it the line's tree.
      unpack; rm -rf megatron && cp -r "$TREES/line/megatron" megatron
      FORK_PRISTINE_TREE=$PWD/$TREES/dev GPU_SUITE_PATCHES=lines/upstream-dev/patches GPU_SUITE_PATHS=tests \
        timeout ${SUITE_TIMEOUT:-560} bash tests/run_gpu_suite.sh -n ${SUITE_WORKERS:-15} --timeout 170 2>&1 \
        | tee "$OUT/suite.log" | grep -E "^(FAILED|ERROR)|passed|failed" | tail -40 ;;
    mla-repeats)
      unpack; rm -rf megatron && cp -r "$TREES/line/megatron" megatron
      timeout ${MLA_TIMEOUT:-400} python3 -m bench mla_rope_repeats --repeats ${REPEATS:-8} 2>&1 \
        | tee "$OUT/mla-repeats.txt" | tail -20 ;;
    bench)
      unpack; line=$TREES/line; [ "${SCHEDULE:-fused}" = split ] && line=$TREES/line-split
      h=${HIDDEN:-4096}; heads=$((h / 128))
      timeout ${BENCH_TIMEOUT:-560} python3 bench/te_bench.py --upstream "$TREES/dev" --fork-root "$line" \
        --only ${ONLY:-devmhc-line-vs-dev fork-vs-upstream} --no-recompute --batch 2 --hidden "$h" --heads "$heads" \
        --rounds ${ROUNDS:-6} --steps ${STEPS:-6} --log-dir /tmp/devbench \
        --json "$OUT/line-vs-dev-$h-${SCHEDULE:-fused}.json" 2>&1 | tee "$OUT/line-vs-dev-$h-${SCHEDULE:-fused}.log" | tail -30 ;;
    sweep)
      unpack
      timeout ${SWEEP_TIMEOUT:-400} python3 bench/proj_block_sweep.py --root "$TREES/line" --hidden ${HIDDEN:-4096} 2>&1 \
        | tee "$OUT/proj-block-sweep-${HIDDEN:-4096}.txt" | tail -30 ;;
    *) echo "unknown step $step (see the header)"; exit 2 ;;
  esac
done
