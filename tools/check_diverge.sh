#!/usr/bin/env bash
# CI: build/bin/diverge over every layout of tools/diverge_layouts.txt (the N-D parity suite's, the
# mixed-precision ones, the CP variants and recomputation, mixtures of experts), 3 steps each: each must report no
# divergence (exit 0), or, marked "refused", be refused naming why (exit 1, "diverge: --..." on
# stderr). Then the planted faults of tools/diverge_faults.txt (diverge --inject), each of which must
# be named: diverge exits 1 and its FIRST DIVERGENCE line gives the table's step, phase and module or
# parameter, every rank listed under it having the table's mesh coordinate; and every lessons/*.cpp
# --break- switch must be in that table, planted or said why not. Prints a line per layout
# and fault, and the time taken.
#
#   bash tools/check_diverge.sh          (after make build/bin/diverge): layouts, then faults
#   bash tools/check_diverge.sh faults   the faults only
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/diverge
table=tools/diverge_layouts.txt
model=(--n-layer 2 --n-embd 16 --n-head 4 --block-size 16 --batch-size 8 --lr 1e-2 --steps 3 --threads 1)
start=$SECONDS
# Every layout of the parity suite is in the table under its name.
missing=0
for name in $(grep -o 'add({.name = "[^"]*"' tests/parallel/nd/test_nd_parallel.cpp | sed 's/.*"\(.*\)"/\1/'); do
  grep -q "^nd  $name " "$table" || { echo "check_diverge: $name (tests/parallel/nd) is not in $table"; missing=1; }
done
[ $missing -eq 0 ] || exit 1
failed=0 count=0
[ "${1:-}" = faults ] && table=/dev/null
while read -r suite name rest; do
  case "$suite" in ''|'#'*) continue ;; esac
  count=$((count + 1))
  refused=0
  if [ "${rest%% *}" = refused ]; then refused=1; rest=${rest#refused }; fi
  set +e
  # shellcheck disable=SC2086  # the table's flags split into words
  out=$("$bin" "${model[@]}" $rest 2>&1)
  rc=$?
  set -e
  if [ $refused -eq 1 ]; then
    if [ $rc -eq 1 ] && grep -q '^diverge: --' <<<"$out"; then echo "ok    $suite $name: refused: $(grep '^diverge: --' <<<"$out" | cut -c 1-140)"
    else echo "FAIL  $suite $name: expected a refusal, exit $rc"; echo "$out" | tail -n 12; failed=1; fi
  elif [ $rc -eq 0 ]; then
    echo "ok    $suite $name: $(tail -n 1 <<<"$out")"
  else
    echo "FAIL  $suite $name ($rest): exit $rc"; echo "$out" | tail -n 12; failed=1
  fi
done <"$table"
[ "${1:-}" = faults ] || echo "check_diverge: $count layouts in $((SECONDS - start)) s"
# One planted fault: diverge must exit 1 naming it where the table says.
check_fault() {  # name, layout flags, fault, expected "step phase name coordinate"
  local name=$1 flags=$2 fault=$3 step phase target coordinate out rc first
  read -r step phase target coordinate <<<"$4"
  set +e
  # shellcheck disable=SC2086  # the table's flags split into words
  out=$("$bin" "${model[@]}" $flags --inject "$fault" 2>&1)
  rc=$?
  set -e
  first=$(grep '^FIRST DIVERGENCE' <<<"$out" || true)
  if [ $rc -ne 1 ] || [ "$first" != "FIRST DIVERGENCE: step $step, $phase, $target" ] || grep -q 'acted on no rank' <<<"$out"; then
    echo "FAIL  fault $name: exit $rc, expected 'FIRST DIVERGENCE: step $step, $phase, $target'"; echo "$out" | grep -v '^  \|^bounds' | tail -n 8
    return 1
  fi
  local ranks
  ranks=$(grep -A 64 '^FIRST DIVERGENCE' <<<"$out" | grep '^  rank ' || true)
  if [ "$coordinate" != - ] && grep -v "[( ]${coordinate}[ )]" <<<"$ranks" | grep -q .; then
    echo "FAIL  fault $name: a rank named without $coordinate:"; echo "$ranks"; return 1
  fi
  echo "ok    fault $name: $first; $(sed 's/^  rank \([0-9]*\) (\([^)]*\)).*/rank \1 (\2)/' <<<"$ranks" | paste -sd ';' | sed 's/;/; /g')"
}
faults=0
fault_start=$SECONDS
trim() { sed 's/^ *//; s/ *$//' <<<"$1"; }
while IFS='|' read -r name flags fault expect; do
  case "$name" in ''|'#'*) continue ;; esac
  faults=$((faults + 1))
  check_fault "$(trim "$name")" "$flags" "$(trim "$fault")" "$(trim "$expect")" || failed=1
done <tools/diverge_faults.txt
echo "check_diverge: $faults planted faults in $((SECONDS - fault_start)) s"
# Every lesson's --break- switch is in the fault table: a row planting its mistake, or a line saying
# why no probe fault reproduces it.
for source in lessons/[0-9][0-9]_*.cpp; do
  for switch in $(grep -o -- '--break-[a-z0-9-]*' "$source" | sort -u); do
    grep -qE -- "lessons/$(basename "$source" .cpp) $switch([^a-z0-9-]|$)" tools/diverge_faults.txt ||
      { echo "FAIL  $source $switch is not in tools/diverge_faults.txt"; failed=1; }
  done
done
exit $failed
