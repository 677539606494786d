#!/usr/bin/env bash
# check_includes.sh — every include points down the layers, and no chapter includes a sibling:
#
#   tensor/ + autograd/   (one layer: the ops are autograd Functions, so each includes the other)
#        ^
#   nn/                   Module, layers, GPT, optimizers, data, safetensors
#        ^
#   parallel/comm/        process groups, backends, launch, mesh, flat buffers, clip_grad_norm
#        ^
#   parallel/runner/      the runner interface: ModelRunner (PartRunner: the one micro-batch loop), DataParallelStrategy
#        ^
#   parallel/data_parallel/  parallel/zero/  parallel/pipeline/  parallel/tensor_parallel/
#   parallel/context_parallel/ parallel/checkpoint/  (the sibling chapters: each includes only itself and the above)
#        ^
#   parallel/nd/          parallelize: the one composition path (every chapter applied to the GPT)
#        ^
#   parallel/train/       the Trainer and the run's plan
#        ^
#   parallel/planner/     the cost model and the planner (it models the chapters; it runs none of them)
#        ^
#   tools/ lessons/ bench/ tests/  (tests/tensor, autograd, nn, parallel/comm and checkpoint include
#                                   only the layers up to parallel/runner, and parallel/checkpoint)
#
# Prints each include that breaks a rule and exits 1 if there is one. CI runs it (.ci/run).
# SL_INCLUDE_ROOT=dir checks another tree (tests/test_check_includes.sh plants a bad include in a copy).
set -uo pipefail
cd "${SL_INCLUDE_ROOT:-$(dirname "$0")/..}"

chapters=(data_parallel zero pipeline tensor_parallel context_parallel checkpoint)
bad=0
# check DIRS -- FORBIDDEN_PREFIXES...: no file under DIRS includes a header under a forbidden prefix.
check() {
  local dirs=()
  while [ "$1" != "--" ]; do dirs+=("$1"); shift; done
  shift
  local pattern
  pattern=$(printf '|%s' "$@")
  pattern="#include \"(${pattern:1})"
  if grep -rnE "$pattern" "${dirs[@]}" --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh'; then
    bad=1
  fi
}
check tensor autograd -- nn/ parallel/ tools/ lessons/ bench/ tests/
check nn -- parallel/ tools/ lessons/ bench/ tests/
check parallel -- tools/ lessons/ bench/ tests/
chapter_dirs=()
for chapter in "${chapters[@]}"; do chapter_dirs+=("parallel/$chapter/"); done
check parallel/comm -- parallel/runner/ "${chapter_dirs[@]}" parallel/nd/ parallel/train/ parallel/planner/
check parallel/runner -- "${chapter_dirs[@]}" parallel/nd/ parallel/train/ parallel/planner/
for chapter in "${chapters[@]}"; do  # a chapter includes no sibling, nor nd/ or train/
  others=()
  for other in "${chapters[@]}"; do [ "$other" != "$chapter" ] && others+=("parallel/$other/"); done
  check "parallel/$chapter" -- "${others[@]}" parallel/nd/ parallel/train/ parallel/planner/
done
check parallel/nd -- parallel/train/ parallel/planner/
check parallel/train -- parallel/planner/
# The tests of the layers below the chapters (and of the checkpoint files) include nothing above them,
# directly or through a support header: their test binary links those layers alone (the Makefile's
# CORE_LAYERS, the AddressSanitizer build's).
core_tests=(tests/tensor tests/autograd tests/nn tests/parallel/comm tests/parallel/checkpoint
            tests/support/test_util.h tests/support/parallel.h tests/support/checkpoint.h tests/support/all_to_all.h
            tests/support/mpi.h tests/support/grad_norm_model.h tests/support/compare.h
            tests/support/serial_run.h)
upper=()
for chapter in "${chapters[@]}"; do [ "$chapter" != checkpoint ] && upper+=("parallel/$chapter/"); done
check "${core_tests[@]}" -- "${upper[@]}" parallel/nd/ parallel/train/ parallel/planner/ tools/ tests/support/trainer.h tests/support/vocab.h

if [ "$bad" -ne 0 ]; then
  echo "check_includes: the includes above break the layers (comm <- runner <- chapters <- nd <- train <- planner <- tools/lessons/bench/tests; no chapter includes a sibling)"
  exit 1
fi
echo "check_includes: every include points down (tensor/autograd <- nn <- comm <- runner <- chapters <- nd <- train <- planner <- tools/lessons/bench/tests)"
