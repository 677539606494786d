#!/usr/bin/env bash
# test_check_includes.sh — check_includes.sh must fail on every kind of bad include. Copies the
# sources to a scratch tree, plants one include at a time that breaks a rule, and expects exit 1;
# the unplanted copy must pass. CI runs it after check_includes.sh (.ci/run).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for dir in tensor autograd nn parallel tools lessons bench tests; do cp -r "$root/$dir" "$scratch/"; done

failures=0
expect() {  # expect WANT_EXIT FILE HEADER: plant `#include "HEADER"` in FILE, run the check
  local want=$1 file=$2 header=$3
  cp "$scratch/$file" "$scratch/$file.orig"
  [ -n "$header" ] && echo "#include \"$header\"" >> "$scratch/$file"
  SL_INCLUDE_ROOT="$scratch" bash "$root/tools/check_includes.sh" > /dev/null
  local got=$?
  mv "$scratch/$file.orig" "$scratch/$file"
  if [ "$got" -ne "$want" ]; then
    echo "test_check_includes: ${header:-nothing} planted in $file: exit $got, want $want"
    failures=$((failures + 1))
  fi
}
expect 0 parallel/pipeline/stage.cpp ""                                  # the tree as it is
expect 1 nn/gpt.cpp parallel/comm/mesh.h                                  # nn above parallel
expect 1 parallel/comm/mesh.cpp parallel/runner/model_runner.h            # comm knows no runner
expect 1 parallel/runner/micro_batches.cpp parallel/zero/fsdp.h           # the interface knows no chapter
expect 1 parallel/pipeline/stage.cpp parallel/zero/fsdp.h                 # a chapter includes no sibling
expect 1 parallel/tensor_parallel/vocab.cpp parallel/context_parallel/ring_attention.h
expect 1 parallel/zero/fsdp.cpp parallel/train/trainer.h                  # nor train/
expect 1 parallel/data_parallel/ddp.cpp parallel/nd/parallelize.h          # nor nd/
expect 1 parallel/nd/parallelize.cpp parallel/train/trainer.h             # nd below train
expect 1 parallel/train/trainer.cpp tools/train_cli.h                     # parallel below tools
expect 0 parallel/nd/parallelize.cpp parallel/pipeline/stage.h            # nd composes the chapters
expect 0 parallel/train/trainer.cpp parallel/nd/parallelize.h             # train sits above nd
expect 1 tests/parallel/comm/test_mesh.cpp parallel/zero/fsdp.h           # a core layer's test, a chapter
expect 1 tests/nn/test_optim.cpp tests/support/trainer.h                  # ... or the trainer, through support
expect 0 tests/parallel/zero/test_zero.cpp parallel/train/trainer.h       # a chapter's test may use the Trainer
if [ "$failures" -ne 0 ]; then
  echo "test_check_includes: $failures planted includes were judged wrongly"
  exit 1
fi
echo "test_check_includes: 15 cases: every planted bad include fails check_includes.sh, the tree passes"
