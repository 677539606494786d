#!/usr/bin/env bash
# tools/check_coursework.sh — CI: every grader of the exercises and projects bites, and every one is solvable.
#
# For each unit (exercises/NN_name/ and exercises/projects/NN_name/), with the graders `make coursework`
# built (this script builds what is missing):
#   1. the template as shipped must fail (exit 1) and say "not implemented yet": no crash, no hang;
#   2. SOLUTION=1 (the library's own implementation in the same grader) must pass (exit 0);
#   3. each wrong solution, wrong_<what>.cpp in place of the student's file, must fail (exit 1) with the
#      diagnosis it was written to provoke: the text of each of its `// expect:` lines in what the failed
#      checks say. A unit must have at least two.
# Exercises run under `timeout 60`, projects under `timeout 120` (the make recipes' limits). The graders
# run one at a time: several of them measure overlap and time on the machine's cores.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
make --no-print-directory coursework >"$BUILD/check_coursework_build.log" 2>&1 ||
  echo "check_coursework: some graders did not build (see $BUILD/check_coursework_build.log); they fail below"

failures=0 units=0 graded=0
summary=""
fail() { failures=$((failures + 1)); line+=" FAIL($1)"; }

# grade BINARY LOG LIMIT: runs a grader, leaves its output in LOG, returns its exit status.
grade() {
  if [ ! -x "$1" ]; then
    echo "not built: $1" >"$2"
    return 127
  fi
  timeout "$3" "$1" >"$2" 2>&1
}

for grader in exercises/*/grader.cpp exercises/projects/*/grader.cpp; do
  dir=$(dirname "$grader")
  unit=${dir#exercises/}
  limit=60
  case $unit in projects/*) limit=120 ;; esac
  units=$((units + 1))
  logs=$BUILD/coursework_logs/$unit
  mkdir -p "$logs"
  line=$(printf '  %-34s' "$unit")

  grade "$BUILD/exercises/$unit/grader" "$logs/template.log" $limit
  rc=$?
  graded=$((graded + 1))
  if [ $rc -ne 1 ]; then
    fail "template exited $rc, not 1: $logs/template.log"
  elif ! grep -q "not implemented yet" "$logs/template.log"; then
    fail "template did not say 'not implemented yet': $logs/template.log"
  else
    line+=" template fails;"
  fi

  grade "$BUILD/exercises-solution/$unit/grader" "$logs/solution.log" $limit
  rc=$?
  graded=$((graded + 1))
  if [ $rc -ne 0 ]; then
    fail "SOLUTION=1 exited $rc: $logs/solution.log"
    tail -n 15 "$logs/solution.log"
  else
    line+=" SOLUTION=1 passes;"
  fi

  wrongs=0
  for wrong in "$dir"/wrong_*.cpp; do
    [ -e "$wrong" ] || continue
    what=$(basename "$wrong" .cpp)
    wrongs=$((wrongs + 1))
    mapfile -t expects < <(sed -n 's|^// expect: *||p' "$wrong")
    if [ ${#expects[@]} -eq 0 ]; then
      fail "$what has no '// expect:' line"
      continue
    fi
    grade "$BUILD/exercises/$unit/$what" "$logs/$what.log" $limit
    rc=$?
    graded=$((graded + 1))
    if [ $rc -ne 1 ]; then
      fail "$what exited $rc, not 1: $logs/$what.log"
      continue
    fi
    for expect in "${expects[@]}"; do  # in what the failed checks say, not in the names of passed ones
      grep -v '^  PASS  ' "$logs/$what.log" | grep -qF -- "$expect" || fail "$what: no '$expect' in $logs/$what.log"
    done
  done
  if [ $wrongs -lt 2 ]; then
    fail "$wrongs wrong solutions (wrong_*.cpp), at least 2 expected"
  else
    line+=" $wrongs wrong solutions caught;"
  fi
  summary+="$line"$'\n'
done
printf '%s' "$summary"
echo "check_coursework: $units units, $graded gradings"
if [ "$failures" -ne 0 ]; then
  echo "check_coursework: $failures FAILED"
  exit 1
fi
echo "check_coursework: every template fails, every SOLUTION=1 passes, every wrong solution is caught"
