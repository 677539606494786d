#!/usr/bin/env bash
# tools/check_projects.sh — CI: every project's grader bites and runs to the end on a known-good baseline.
#
# For each exercises/projects/NN_name/:
#   1. grade the template as shipped: it must fail (exit non-zero) and say "not implemented yet",
#      within the make recipe's `timeout 120` (exit 124 is a hang; a crash is a signal's exit code);
#   2. grade with SOLUTION=1 (the grader's baseline wired in from the library): exit 0.
# Always make -j1: the graders train and simulate on CI's shared cores.
set -u
cd "$(dirname "$0")/.."
mkdir -p build
failures=0 count=0
summary=""
for grader in exercises/projects/*/grader.cpp; do
  pr=$(basename "$(dirname "$grader")")
  n=${pr%%_*}
  count=$((count + 1))
  log=build/check_project_$pr.log
  make --no-print-directory -j1 project N="$n" >"$log" 2>&1
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
  slog=build/check_project_${pr}_solution.log
  if make --no-print-directory -j1 project N="$n" SOLUTION=1 >"$slog" 2>&1; then
    solution="ok ($(grep -o '[0-9]* of [0-9]* checks passed' "$slog" | tail -1))"
  else
    solution="FAIL (see $slog)"
    tail -n 20 "$slog"
  fi
  case "$template $solution" in *FAIL*) failures=$((failures + 1)); tail -n 20 "$log" ;; esac
  summary+=$(printf '  %-30s template: %-40s SOLUTION=1: %s' "$pr" "$template" "$solution")$'\n'
done
echo "check_projects: every template fails cleanly, every SOLUTION=1 passes"
printf '%s' "$summary"
if [ "$failures" -ne 0 ]; then
  echo "check_projects: $failures of $count projects FAILED"
  exit 1
fi
echo "check_projects: $count of $count projects OK"
