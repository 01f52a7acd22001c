#!/usr/bin/env bash
# Run every GPU-marked test in one command on a CUDA machine and print pytest's summary.
# Usage (from any directory of the checkout): bash tests/run_gpu_suite.sh [extra pytest args]
# Needs the materialized megatron/ (python -m tools.rebase apply, or carry it to the machine).
#   GPU_SUITE_PATHS: the test paths (default tests/), e.g. one part of a suite split over calls.
#   GPU_SUITE_PATCHES=DIR (a patches/ directory: patches, lines/upstream-dev/patches): instead, every
#     test file the Tests: trailers there name, plus tests/integration, and every test in them, not
#     only the gpu-marked ones: a line's whole suite on a CUDA host (tests follow unit_device()).
#   GPU_SUITE_DRY=1: print the pytest command and stop (any machine).
set -uo pipefail
cd "$(dirname "$0")/.."
# Never use NVLink multicast on shared hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}
MARK=(-m gpu)
if [ -n "${GPU_SUITE_PATCHES:-}" ]; then
    GPU_SUITE_PATHS="$("$PY" - "$GPU_SUITE_PATCHES" <<'PYEOF'
import re
import sys
from pathlib import Path

from tools.rebase.errors import RebaseError
from tools.rebase.stack.series import parse_patch, read_series

where = Path(sys.argv[1])
if not (where / "series").is_file():
    sys.exit(f"GPU_SUITE_PATCHES={where}: no series file there (a patches/ directory is expected)")
try:
    ids = [t for e in read_series(where / "series").entries for t in parse_patch(where / e.name).tests]
except RebaseError as exc:
    sys.exit(f"GPU_SUITE_PATCHES={where}: {exc}")
paths = sorted({t.split("::", 1)[0] for t in ids})
# Each becomes a pytest argument: only a test file under tests/ (no option, no "..", no other path).
bad = [p for p in paths if not re.fullmatch(r"tests/[A-Za-z0-9_./-]+\.py", p) or ".." in p.split("/")]
if bad:
    sys.exit(f"GPU_SUITE_PATCHES={where}: a Tests: trailer names something that is not a test file under tests/: {bad[0]!r}")
print(" ".join(paths))
PYEOF
)" || exit 2
    GPU_SUITE_PATHS="$GPU_SUITE_PATHS tests/integration"
    MARK=()
fi
CMD=("$PY" -m pytest ${GPU_SUITE_PATHS:-tests} "${MARK[@]}" -p no:cacheprovider -rA -q "$@")
if [ -n "${GPU_SUITE_DRY:-}" ]; then
    echo "${CMD[@]}"
    exit 0
fi
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
exec "${CMD[@]}"
