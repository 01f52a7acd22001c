#!/usr/bin/env bash
# Build the two trees a GPU run of the upstream-main line carries (bench/te_gpu_batch.sh):
#   .linetree/megatron      the line applied (apply --line upstream-main), run as the fork
#   .upstream-main/megatron upstream's own package at the line's pinned commit (UPSTREAM_TREE)
# then re-apply the release line, so megatron/ is the release tree again.
# Usage: bash bench/line_trees.sh MIRROR   (a local clone of NVIDIA/Megatron-LM holding the pin)
set -euo pipefail
cd "$(dirname "$0")/.."
mirror=${1:?usage: bash bench/line_trees.sh MIRROR, a local clone holding the pinned commit}
line=${LINE:-upstream-main}
# apply first: it refuses a linked pin or line folder (checkout data) before anything reads them.
python3 -m tools.rebase apply --line "$line" --mirror "$mirror"
# A git pin (apply --mirror refuses any other); the tool's loader validates its 40-hex commit.
commit=$(python3 -c "import sys; from pathlib import Path; from tools.rebase.stack.pin import load_pin; print(load_pin(Path(sys.argv[1])).commit)" "lines/$line/upstream.toml")
rm -rf .linetree .upstream-main && mkdir -p .linetree .upstream-main
cp -r megatron .linetree/megatron
git -C "$mirror" archive "$commit" -- megatron | tar -x -C .upstream-main
python3 -m tools.rebase apply
echo "line_trees: .linetree/megatron ($line) and .upstream-main/megatron ($commit); megatron/ is the release tree again"
