#!/usr/bin/env bash
# check_includes.sh — every include points down the layers:
#
#   tensor/ + autograd/   (one layer: the ops are autograd Functions, so each includes the other)
#        ^
#   nn/                   Module, layers, GPT, optimizers, data, safetensors
#        ^
#   parallel/             comm/ (process groups, backends, launch, mesh), then the techniques built on
#                         it (data_parallel/, zero/, train/ ...); comm/ includes none of them
#        ^
#   tools/ lessons/ bench/ tests/
#
# Prints each include that points up and exits 1 if there is one. CI runs it (.ci/run).
set -uo pipefail
cd "$(dirname "$0")/.."

bad=0
# check LAYER_DIRS FORBIDDEN_PREFIXES...: no file under the dirs includes a header under a forbidden prefix.
check() {
  local dirs=$1; shift
  local pattern
  pattern=$(printf '|%s' "$@")
  pattern="#include \"(${pattern:1})"
  # shellcheck disable=SC2086
  if grep -rnE "$pattern" $dirs --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh'; then
    bad=1
  fi
}
check "tensor autograd" nn/ parallel/ tools/ lessons/ bench/ tests/
check "nn" parallel/ tools/ lessons/ bench/ tests/
check "parallel" tools/ lessons/ bench/ tests/
# Inside parallel/: the communication layer knows no technique; a technique may build on an earlier one.
check "parallel/comm" parallel/data_parallel/ parallel/zero/ parallel/train/ parallel/pipeline/ \
  parallel/tensor_parallel/ parallel/context_parallel/

if [ "$bad" -ne 0 ]; then
  echo "check_includes: the includes above point up a layer (tensor/autograd <- nn <- parallel <- tools/lessons/bench/tests)"
  exit 1
fi
echo "check_includes: every include points down (tensor/autograd <- nn <- parallel <- tools/lessons/bench/tests)"
