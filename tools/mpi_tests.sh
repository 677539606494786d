#!/usr/bin/env bash
# mpi_tests.sh BINARY [GTEST_FILTER] — runs a GoogleTest binary as an MPI job, one process per rank:
# first `mpirun -np 2`, then `-np 4`, with the filter (default: the collective and MPI suites, and the
# parity suites of naive DP, DDP, ZeRO-1/2, FSDP, HSDP, the pipeline, tensor and context parallelism, N-D).
#
#   tools/mpi_tests.sh build/tests/shardlab_tests
#   tools/mpi_tests.sh build/tests/shardlab_tests 'MpiFailures*'
#
# All traffic stays on this machine (tools/mpi_env.sh: shared memory between ranks, mpirun's control
# channel on loopback, inside a loopback-only network namespace where one can be made). Each rank's output goes to
# its own log; rank 0's is shown, and every failing rank's. Exits non-zero if any rank fails, crashes,
# or the job runs past its time limit (a hang, e.g. in MPI_Finalize after a failure test).
set -uo pipefail

binary=${1:?usage: tools/mpi_tests.sh BINARY [GTEST_FILTER]}
# The collective and MPI suites, then every data-parallel technique's parity suite (the same tests
# that run on rank threads, here one process per rank over the MPI backend; a world other than -np skips).
collectives='Collectives/*:Long/AllReduce.*:Worlds/Collectives.*:Mpi*:*/MpiCollectives.*'
parity='Layouts/DataParallel.*:Layouts/DDPNoSync.*:Stages/Zero.*:Layouts/Fsdp.*:Layouts/Hsdp.*:Layouts/TrainerTest.*'
parity+=':Grid/PipelineParity.*:Long/PipelineParity.*:PipelineStages.*:Sync/PipelineDataParallel.*:Layouts/PipelineTrainer.*'
parity+=':Layouts/TensorParallelParity.*:Layouts/TensorParallelCost.*:Worlds/TPOps.*:TensorParallel.*:TPOpsErrors.*'
parity+=':Layouts/ContextParallelParity.*:Layouts/RingVsFull.*_T64:Layouts/UlyssesParity.*'
parity+=':Layouts/NdParallelParity.*:NdParallel.*'
filter=${2:-"$collectives:$parity"}
time_limit=${SL_MPI_TEST_TIMEOUT:-300}  # seconds per mpirun

source "$(dirname "$0")/mpi_env.sh" || exit 2
[ -x "$binary" ] || { echo "mpi_tests: $binary is not an executable (build it first: make)" >&2; exit 2; }

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

status=0
for np in 2 4; do
  echo "=== mpirun -np $np $binary --gtest_filter='$filter'"
  rm -f "$logs"/rank.*
  # Each rank writes its own log (OMPI_COMM_WORLD_RANK is set by mpirun for every process).
  timeout --kill-after=10 "$time_limit" "${isolate[@]}" mpirun "${mpirun_args[@]}" -np "$np" \
    sh -c 'exec "$@" > "'"$logs"'/rank.$OMPI_COMM_WORLD_RANK" 2>&1' sh \
    "$binary" --gtest_filter="$filter" --gtest_color=no
  code=$?
  if [ "$code" -eq 124 ] || [ "$code" -eq 137 ]; then
    echo "mpi_tests: np $np: the job ran past ${time_limit} s and was killed (a hang?)"
  fi
  [ -f "$logs/rank.0" ] && cat "$logs/rank.0"
  # One summary line per rank; the whole log of any rank that did not pass.
  for r in $(seq 0 $((np - 1))); do
    log="$logs/rank.$r"
    if [ ! -f "$log" ]; then
      echo "mpi_tests: np $np rank $r: no log (it never started?)"
      [ "$code" -eq 0 ] && code=1
      continue
    fi
    count() { sed -n "s/^\[  $1 *\] \([0-9]*\) tests\{0,1\}[,.].*/\1/p" "$log" | tail -n 1; }
    passed=$(count PASSED) failed=$(count FAILED) skipped=$(count SKIPPED)
    if [ -z "$passed" ] || [ -n "$failed" ]; then
      [ "$r" -ne 0 ] && { echo "--- np $np, rank $r:"; cat "$log"; }
      [ "$code" -eq 0 ] && code=1
    fi
    echo "mpi_tests: np $np rank $r: ${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped"
  done
  echo "mpi_tests: np $np: exit status $code"
  [ "$code" -eq 0 ] || status=1
done
[ "$status" -eq 0 ] && echo "mpi_tests: all passed" || echo "mpi_tests: FAILED"
exit "$status"
