#!/usr/bin/env bash
# Install the RL client libraries that tests/integration runs against, into the active Python.
#
# verl and mbridge are installed without their dependency trees (verl's pulls Ray, vLLM, another
# torch, ...): the modules the tests import need only torch, the fork, einops and packaging, which
# are there already, plus transformers and safetensors. transformers comes with its own
# dependencies. A constraints file pins the installed torch, so pip can never replace it, and the
# script checks afterwards that torch and the fork are exactly what they were.
#
# transformers is 4.57.6 (the last 4.x): mbridge 0.15.1 reads 4.x config attributes (rope_theta)
# that 5.x moved; verl's Megatron patch modules do not import transformers at all.
set -euo pipefail

PY=${PYTHON:-python}
CLIENTS=(verl==0.9.1 mbridge==0.15.1)
TRANSFORMERS=transformers==4.57.6

identity() {  # torch version and file, fork version and file
    "$PY" - <<'PYEOF'
import importlib.util, torch
spec = importlib.util.find_spec("megatron.core")
import megatron.core as core
print(torch.__version__, torch.__file__, core.__version__, spec.origin)
PYEOF
}

before=$(identity)
torch_version=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==$torch_version" > "$constraints"

start=$(date +%s)
"$PY" -m pip install -q -c "$constraints" "$TRANSFORMERS"
"$PY" -m pip install -q --no-deps -c "$constraints" "${CLIENTS[@]}"
echo "install_clients: ${CLIENTS[*]} $TRANSFORMERS installed in $(( $(date +%s) - start )) s"

after=$(identity)
if [ "$before" != "$after" ]; then
    echo "install_clients: torch or the fork changed: before '$before', after '$after'" >&2
    exit 1
fi
echo "install_clients: torch and the fork unchanged ($after)"
