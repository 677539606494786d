#!/usr/bin/env bash
# tools/check_exercises.sh — CI: every exercise's grader bites and every exercise is solvable.
#
# For each exercises/NN_name/:
#   1. grade the template as shipped: it must fail (exit non-zero) and say "not implemented yet",
#      within the make recipe's `timeout 60` (exit 124 is a hang; a crash is a signal's exit code);
#   2. grade with SOLUTION=1 (the library's own implementation wired into the same grader): exit 0.
# The graders are built first with -j2 (both kinds), then graded one at a time.
set -u
cd "$(dirname "$0")/.."
mkdir -p build
# Build every grader both ways first, two compilers at a time; a grader that does not build shows
# below as "no score".
make --no-print-directory -j2 exercise-graders >build/check_exercises_build.log 2>&1 || true
make --no-print-directory -j2 exercise-graders SOLUTION=1 >build/check_exercises_build_solution.log 2>&1 || true
failures=0 count=0
summary=""
for grader in exercises/*/grader.cpp; do
  ex=$(basename "$(dirname "$grader")")
  n=${ex%%_*}
  count=$((count + 1))
  log=build/check_exercise_$ex.log
  make --no-print-directory -j1 exercise N="$n" >"$log" 2>&1
  template_rc=$?
  score=$(grep -o '[0-9]* of [0-9]* checks passed' "$log" | tail -1)
  if ! grep -q "checks passed" "$log"; then
    template="FAIL (no score: build error, crash or hang; see $log)"
  elif ! grep -q "not implemented yet" "$log"; then
    template="FAIL (the template did not say 'not implemented yet')"
  elif [ "$template_rc" -eq 0 ]; then
    template="FAIL (the template exited 0)"
  else
    template="ok ($score)"
  fi
  slog=build/check_exercise_${ex}_solution.log
  if make --no-print-directory -j1 exercise N="$n" SOLUTION=1 >"$slog" 2>&1; then
    solution="ok ($(grep -o '[0-9]* of [0-9]* checks passed' "$slog" | tail -1))"
  else
    solution="FAIL (see $slog)"
    tail -n 20 "$slog"
  fi
  case "$template $solution" in *FAIL*) failures=$((failures + 1)); tail -n 20 "$log" ;; esac
  summary+=$(printf '  %-24s template: %-40s SOLUTION=1: %s' "$ex" "$template" "$solution")$'\n'
done
echo "check_exercises: every template fails cleanly, every SOLUTION=1 passes"
printf '%s' "$summary"
if [ "$failures" -ne 0 ]; then
  echo "check_exercises: $failures of $count exercises FAILED"
  exit 1
fi
echo "check_exercises: $count of $count exercises OK"
