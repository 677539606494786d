#!/usr/bin/env bash
# tools/check_lessons.sh — CI: every lesson a student can change really changes, and every "break it"
# switch really breaks it. For each built lesson (build/lessons/NN_name):
#   1. `--help` exits 0 and lists its flags;
#   2. `--svg DIR` writes at least one .svg and the lesson still passes;
#   3. each `--break-<what>` its --help lists: the lesson must exit 1 (its check failed), within
#      `timeout 120`, not 0 (the check missed the mistake), not a crash (a signal) or a hang (124);
#   4. an unknown flag exits 2.
# Run after `make lessons` (which builds them and runs each with its defaults).
set -u
cd "$(dirname "$0")/.."
lessons=$(for source in lessons/[0-9][0-9]_*.cpp; do echo "build/lessons/$(basename "$source" .cpp)"; done)
for lesson in $lessons; do
  test -x "$lesson" || { echo "check_lessons: $lesson is not built (run make lessons first)"; exit 1; }
done
failures=0 breaks=0 pictures=0
fail() { echo "  FAIL $1"; failures=$((failures + 1)); }
for lesson in $lessons; do
  name=$(basename "$lesson")
  help=$(timeout 30 "$lesson" --help 2>&1) || { fail "$name --help exited non-zero"; continue; }
  grep -q -- '--svg' <<<"$help" || fail "$name --help lists no --svg"
  timeout 30 "$lesson" --no-such-flag >/dev/null 2>&1
  [ $? -eq 2 ] || fail "$name accepted --no-such-flag (must exit 2)"
  dir=build/lesson_svg/$name
  rm -rf "$dir"
  if timeout 120 "$lesson" --svg "$dir" >"build/lesson_svg_$name.log" 2>&1; then
    count=$(ls "$dir"/*.svg 2>/dev/null | wc -l)
    [ "$count" -ge 1 ] || fail "$name --svg $dir wrote no .svg"
    pictures=$((pictures + count))
  else
    fail "$name --svg $dir exited non-zero (see build/lesson_svg_$name.log)"
  fi
  for switch in $(grep -o -- '--break-[a-z0-9-]*' <<<"$help" | sort -u); do
    breaks=$((breaks + 1))
    timeout 120 "$lesson" "$switch" >"build/lesson_break_${name}${switch}.log" 2>&1
    rc=$?
    case $rc in
      1) echo "  ok   $name $switch: its check failed, as it must";;
      0) fail "$name $switch exited 0: the check missed the mistake";;
      124) fail "$name $switch hung (timeout 120)";;
      *) fail "$name $switch exited $rc (a crash?) (see build/lesson_break_${name}${switch}.log)";;
    esac
  done
done
echo "check_lessons: $(wc -w <<<"$lessons") lessons, $pictures pictures, $breaks break-it switches"
if [ "$failures" -ne 0 ]; then
  echo "check_lessons: $failures FAILED"
  exit 1
fi
echo "check_lessons: OK"
