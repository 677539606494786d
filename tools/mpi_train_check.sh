#!/usr/bin/env bash
# mpi_train_check.sh [TRAIN] — the main job as an MPI job: `mpirun -np 2 train --dp 2 --zero 2` (ZeRO-2,
# one process per rank over the MPI backend) must log the serial run's losses, step by step, within
# the parity tolerance (rtol 1.3e-6, atol 1e-5). Prints the largest difference; exits non-zero if a
# loss differs by more, a step is missing, or either run fails.
#
#   tools/mpi_train_check.sh                    # build/bin/train
#   SL_MPI_TRAIN_STEPS=100 tools/mpi_train_check.sh
#
# No warm-up (the full lr 1e-2 from step 0) and weight decay 0.1, so a wrong gradient scale or a
# lost decay shows in the losses within a few steps. --adam-eps 1e-6: with AdamW's default 1e-8 the
# float noise of the attention key bias's gradient (exactly 0 in exact arithmetic) becomes updates
# of size lr, and any change of summation order, the threads backend's included, moves the loss by
# ~2e-4 by step 11. mpirun is set up as for the tests (tools/mpi_env.sh).
set -uo pipefail

train=${1:-build/bin/train}
steps=${SL_MPI_TRAIN_STEPS:-30}
time_limit=${SL_MPI_TEST_TIMEOUT:-300}  # seconds for the mpirun

source "$(dirname "$0")/mpi_env.sh" || exit 2
[ -x "$train" ] || { echo "mpi_train_check: $train is not an executable (build it first: make)" >&2; exit 2; }

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--steps "$steps" --warmup-steps 0 --lr 1e-2 --adam-eps 1e-6 --weight-decay 0.1 --batch-size 32 --n-embd 64
  --eval-every 0 --threads 1)

echo "=== serial: $train ${args[*]}"
if ! "$train" "${args[@]}" --log-jsonl "$dir/serial.jsonl" > "$dir/serial.out" 2>&1; then
  cat "$dir/serial.out"
  echo "mpi_train_check: the serial run failed"
  exit 1
fi

echo "=== mpirun -np 2 $train ${args[*]} --dp 2 --zero 2"
# Each rank writes its own log and output (only rank 0 logs steps; rank 1's log stays empty).
timeout --kill-after=10 "$time_limit" "${isolate[@]}" mpirun "${mpirun_args[@]}" -np 2 \
  sh -c 'exec "$@" --log-jsonl "'"$dir"'/mpi.$OMPI_COMM_WORLD_RANK.jsonl" > "'"$dir"'/mpi.$OMPI_COMM_WORLD_RANK.out" 2>&1' \
  sh "$train" "${args[@]}" --dp 2 --zero 2
code=$?
echo "--- rank 0:"
cat "$dir/mpi.0.out"
if [ "$code" -ne 0 ]; then
  echo "--- rank 1:"
  [ -f "$dir/mpi.1.out" ] && cat "$dir/mpi.1.out"
  echo "mpi_train_check: mpirun exited with $code"
  exit 1
fi
if ! grep -q "over 2 ranks (mpi backend)" "$dir/mpi.0.out"; then
  echo "mpi_train_check: rank 0 did not run on the MPI backend"
  exit 1
fi

# The "loss" of every line, serial against MPI's rank 0.
losses() { sed -n 's/.*"loss": *\([^,}]*\).*/\1/p' "$1"; }
paste <(losses "$dir/serial.jsonl") <(losses "$dir/mpi.0.jsonl") | awk -v steps="$steps" '
  NF != 2 { printf "mpi_train_check: step %d is missing from one log\n", NR - 1; bad = 1; next }
  $1 !~ /^-?[0-9]/ || $2 !~ /^-?[0-9]/ { printf "mpi_train_check: step %d: loss %s vs %s\n", NR - 1, $1, $2; bad = 1; next }
  {
    d = $1 - $2; if (d < 0) d = -d
    tol = 1e-5 + 1.3e-6 * ($1 < 0 ? -$1 : $1)
    if (d > worst) { worst = d; at = NR - 1 }
    if (d > tol) { printf "mpi_train_check: step %d: serial loss %s, mpi %s (difference %.3g > %.3g)\n", NR - 1, $1, $2, d, tol; bad = 1 }
  }
  END {
    if (NR != steps) { printf "mpi_train_check: %d logged steps, expected %d\n", NR, steps; bad = 1 }
    printf "mpi_train_check: %d steps, largest loss difference %.3g (step %d)\n", NR, worst, at
    if (bad) { print "mpi_train_check: FAILED"; exit 1 }
    print "mpi_train_check: the mpirun -np 2 --zero 2 log equals the serial one"
  }'
