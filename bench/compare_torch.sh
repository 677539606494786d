#!/usr/bin/env bash
# compare_torch.sh — shardlab against PyTorch on this machine, in one run (ratios, not absolute times:
# these machines are noisy). Alternates the two sides `rounds` times and reports medians.
#
#   bash bench/compare_torch.sh [rounds]        (needs python3-torch; see ../shared/bench/README.md)
#
# Both sides run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (the machine sets them to a
# slower kernel for old OpenBLAS builds) and with torch on OpenBLAS, as the shared README says.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shared=../shared/bench
clean="env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE"
torch_env="$clean LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread"
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch' 2>/dev/null || {
  echo "compare_torch: PyTorch is not installed (apt-get install -y python3-torch python3-numpy libopenblas0-pthread)" >&2
  exit 1
}
make --no-print-directory build/bench/gemm build/bench/gpt_step >/dev/null

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
field() { sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p"; }

for config in A B; do
  ours=(); theirs=()
  for ((r = 0; r < rounds; r++)); do
    ours+=("$($clean build/bench/gpt_step --config $config | field median_ms)")
    theirs+=("$($torch_env /usr/bin/python3 $shared/gpt_torch.py --config $config --threads 1 | field median_s)")
  done
  o=$(printf '%s\n' "${ours[@]}" | median)
  t=$(printf '%s\n' "${theirs[@]}" | median | awk '{print $1 * 1000}')
  echo "{\"bench\": \"gpt_step_vs_torch\", \"config\": \"$config\", \"threads\": 1, \"shardlab_ms\": $o, \"torch_ms\": $t, \"ratio\": $(awk -v o="$o" -v t="$t" 'BEGIN {printf "%.3f", o / t}'), \"runs\": \"${ours[*]} | ${theirs[*]}\"}"
done

for n in 256 512 1024 2048; do
  for threads in 1 2; do
    ours=(); theirs=()
    for ((r = 0; r < rounds; r++)); do
      ours+=("$($clean build/bench/gemm --sizes $n --threads $threads | field gflops)")
      theirs+=("$($torch_env /usr/bin/python3 $shared/gemm_torch.py --sizes $n --threads $threads --reps 10 | grep '^JSON' | field gflops_median)")
    done
    o=$(printf '%s\n' "${ours[@]}" | median); t=$(printf '%s\n' "${theirs[@]}" | median)
    echo "{\"bench\": \"gemm_vs_torch\", \"n\": $n, \"threads\": $threads, \"shardlab_gflops\": $o, \"torch_gflops\": $t, \"ratio\": $(awk -v o="$o" -v t="$t" 'BEGIN {printf "%.3f", o / t}')}"
  done
done
