#!/usr/bin/env bash
# run_tests.sh BINARY [gtest args...] — runs a GoogleTest binary and ends with one summary line,
#   tests: N passed, N failed, N skipped
# (the form CI tools read), exiting non-zero if any test failed or the binary crashed.
set -uo pipefail
binary=$1
shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$binary" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
count() { sed -n "s/^\[  $1 *\] \([0-9]*\) tests\{0,1\}[,.].*/\1/p" "$log" | tail -n 1; }
passed=$(count PASSED); failed=$(count FAILED); skipped=$(count SKIPPED)
echo
echo "tests: ${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped"
if [ "$status" -ne 0 ] && [ "${failed:-0}" = 0 ]; then
  echo "tests: the test binary exited with status $status (crash or sanitizer report above)" >&2
fi
exit "$status"
