#!/usr/bin/env bash
# Run every GPU-marked test in one command on a CUDA machine and print pytest's summary.
# Usage (from any directory of the checkout): bash tests/run_gpu_suite.sh [extra pytest args]
# Needs the materialized megatron/ (python -m tools.rebase apply, or carry it to the machine).
set -uo pipefail
cd "$(dirname "$0")/.."
# Never use NVLink multicast on shared hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}
"$PY" - <<'PYEOF'
import sys, torch, triton
print(f"python {sys.version.split()[0]}  torch {torch.__version__}  triton {triton.__version__}  "
      f"cuda devices {torch.cuda.device_count()}: "
      + ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))
if not torch.cuda.is_available():
    sys.exit("no CUDA device: the GPU suite would only skip")
PYEOF
[ $? -eq 0 ] || exit 2
if [ ! -f megatron/core/package_info.py ]; then
    "$PY" -m tools.rebase apply || exit 2
fi
# GPU_SUITE_PATHS: the test paths (default tests/), e.g. one part of a suite split over calls.
exec "$PY" -m pytest ${GPU_SUITE_PATHS:-tests} -m "gpu" -p no:cacheprovider -rA -q "$@"
