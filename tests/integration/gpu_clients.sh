#!/usr/bin/env bash
# The RL client libraries for the GPU run of tests/integration (TE specs), carried as wheels.
#
# The GPU machine has no network: `download` runs here (with the package index) and fills the
# git-ignored folder .clients/ with cp312 manylinux wheels, --no-deps; `install` runs there and
# installs them --no-deps --no-index. Two targets, because the two bridges need two transformers:
#   /tmp/clients     mbridge 0.15.1 + transformers 4.57.6 (mbridge reads 4.x config attributes)
#   /tmp/clients-mb  Megatron-Bridge 0.6.2 + transformers 5.12.1 (it imports 5.x-only model
#                    modules at `import megatron.bridge`; its wheel declares transformers>=5.8,<=5.12.1)
# Only what the tests import is carried (and the image lacks or has in an unknown version):
# each transformers' huggingface_hub, tokenizers, safetensors and regex, and omegaconf for
# Megatron-Bridge. numpy, pyyaml, tqdm, packaging, filelock, fsspec, httpx and typer come from the
# image; `install` warns where the image misses a version transformers or huggingface_hub declare.
#
# On the GPU machine, after ../shared/gpu-te's install.sh (TE in /tmp/site), one command:
#   bash tests/integration/gpu_clients.sh install && bash tests/integration/gpu_clients.sh test
# carry: .clients (31 MB) and megatron/ (materialized by `python -m tools.rebase apply`). To stay
# under a call's carry limit, split it by bridge, one call each while the machine stays warm:
#   carry .clients/common .clients/mbridge          -> install mbridge && test mbridge
#   carry .clients/common .clients/megatron-bridge  -> install megatron-bridge && test megatron-bridge
# `test` runs
#   PYTHONPATH=$PWD:/tmp/clients:/tmp/site    python3 -m pytest tests/integration/test_mbridge_round_trip.py -m gpu -q -rA
#   PYTHONPATH=$PWD:/tmp/clients-mb:/tmp/site python3 -m pytest tests/integration/test_megatron_bridge_round_trip.py -m gpu -q -rA
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -f upstream.toml ] || { echo "gpu_clients: not in the project root" >&2; exit 2; }

PY=${PYTHON:-python3}
WHEELS=.clients
COMMON=(tokenizers==0.22.2 safetensors==0.8.0 regex==2026.11.19)
MBRIDGE=(mbridge==0.15.1 transformers==4.57.6 huggingface_hub==0.36.2)
MEGATRON_BRIDGE=(megatron-bridge==0.6.2 transformers==5.12.1 huggingface_hub==1.33.0 omegaconf==2.4.0)
MBRIDGE_TARGET=/tmp/clients
MEGATRON_BRIDGE_TARGET=/tmp/clients-mb

download() {
    local flags=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
                 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
                 --platform manylinux2014_x86_64)
    local staging="$WHEELS.partial"  # a failed download leaves the last complete .clients/ as it was
    rm -rf "$staging"
    mkdir -p "$staging/common" "$staging/mbridge" "$staging/megatron-bridge"
    "$PY" -m pip download -q "${flags[@]}" -d "$staging/common" "${COMMON[@]}"
    "$PY" -m pip download -q "${flags[@]}" -d "$staging/mbridge" "${MBRIDGE[@]}"
    "$PY" -m pip download -q "${flags[@]}" -d "$staging/megatron-bridge" "${MEGATRON_BRIDGE[@]}"
    local expected=$(( ${#COMMON[@]} + ${#MBRIDGE[@]} + ${#MEGATRON_BRIDGE[@]} ))
    local got
    got=$(find "$staging" -name '*.whl' | wc -l)
    if [ "$got" -ne "$expected" ]; then
        echo "gpu_clients: $got wheels in $staging, expected $expected" >&2
        exit 1
    fi
    rm -rf "$WHEELS"
    mv "$staging" "$WHEELS"
    echo "gpu_clients: $got wheels, $(du -sh "$WHEELS" | cut -f1) in $WHEELS (carry it)"
}

identity() {  # torch version and file, fork version and file, as the tests will see them
    PYTHONPATH="$PWD" "$PY" - <<'PYEOF'
import importlib.util, torch
spec = importlib.util.find_spec("megatron.core")
import megatron.core as core
print(torch.__version__, torch.__file__, core.__version__, spec.origin)
PYEOF
}

check_target() {  # name each declared requirement of the client stack this PYTHONPATH does not meet
    PYTHONPATH="$PWD:$1" "$PY" - "$2" <<'PYEOF'
import importlib.metadata as md, sys
from packaging.requirements import Requirement
problems = []
for dist in sys.argv[1].split(","):
    for text in md.requires(dist) or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            problems.append(f"{dist} needs {req}: not installed")
            continue
        if not req.specifier.contains(have, prereleases=True):
            problems.append(f"{dist} needs {req}: found {have}")
for problem in problems:  # a warning: transformers refuses at import itself where it matters
    print(f"gpu_clients: warning: {problem}")
PYEOF
}

install_target() {  # target, wheel folder, distributions whose requirements must hold
    rm -rf "$1"
    "$PY" -m pip install -q --no-deps --no-index --no-compile --target "$1" "$WHEELS/common"/*.whl "$2"/*.whl
    check_target "$1" "$3"
}

install() {  # which: mbridge, megatron-bridge or all
    local which=$1 before after
    case "$which" in mbridge|megatron-bridge|all) ;; *) echo "gpu_clients: install what? '$which'" >&2; exit 2 ;; esac
    [ -d "$WHEELS/common" ] || { echo "gpu_clients: $WHEELS/common is missing: run 'download' where the index is, and carry it" >&2; exit 1; }
    before=$(identity)
    if [ "$which" != megatron-bridge ]; then
        [ -d "$WHEELS/mbridge" ] || { echo "gpu_clients: $WHEELS/mbridge is missing (carry it)" >&2; exit 1; }
        install_target "$MBRIDGE_TARGET" "$WHEELS/mbridge" transformers,huggingface_hub
        PYTHONPATH="$PWD:$MBRIDGE_TARGET" "$PY" -c 'import transformers, mbridge; print("gpu_clients: mbridge 0.15.1 and transformers", transformers.__version__, "import from", mbridge.__file__.rsplit("/", 2)[0])'
    fi
    if [ "$which" != mbridge ]; then
        [ -d "$WHEELS/megatron-bridge" ] || { echo "gpu_clients: $WHEELS/megatron-bridge is missing (carry it)" >&2; exit 1; }
        install_target "$MEGATRON_BRIDGE_TARGET" "$WHEELS/megatron-bridge" transformers,huggingface_hub,omegaconf
        PYTHONPATH="$PWD:$MEGATRON_BRIDGE_TARGET" "$PY" -c 'import transformers; print("gpu_clients: transformers", transformers.__version__, "imports from", transformers.__file__.rsplit("/", 2)[0])'
    fi
    after=$(identity)
    if [ "$before" != "$after" ]; then
        echo "gpu_clients: torch or the fork changed: before '$before', after '$after'" >&2
        exit 1
    fi
    echo "gpu_clients: torch and the fork unchanged ($after)"
}

run_tests() {  # which, then pytest's own arguments
    local which=$1 status=0
    shift
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    if [ "$which" != megatron-bridge ]; then
        PYTHONPATH="$PWD:$MBRIDGE_TARGET:/tmp/site" "$PY" -m pytest tests/integration/test_mbridge_round_trip.py \
            -m gpu -q -rA -p no:cacheprovider "$@" || status=$?
    fi
    if [ "$which" != mbridge ]; then
        PYTHONPATH="$PWD:$MEGATRON_BRIDGE_TARGET:/tmp/site" "$PY" -m pytest tests/integration/test_megatron_bridge_round_trip.py \
            -m gpu -q -rA -p no:cacheprovider "$@" || status=$?
    fi
    return $status
}

which=${2:-all}
case "$which" in mbridge|megatron-bridge|all) ;; *) echo "gpu_clients: '$which' is not mbridge, megatron-bridge or all" >&2; exit 2 ;; esac
case "${1:-}" in
    download) download ;;
    install) install "$which" ;;
    test) shift; [ $# -gt 0 ] && shift; run_tests "$which" "$@" ;;
    *) echo "usage: bash tests/integration/gpu_clients.sh download | install [mbridge|megatron-bridge|all] | test [mbridge|megatron-bridge|all] [pytest args]" >&2; exit 2 ;;
esac
