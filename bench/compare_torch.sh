#!/usr/bin/env bash
# compare_torch.sh — shardlab against PyTorch on this machine, in one run (ratios, not absolute times:
# these machines are noisy). Alternates the two sides `rounds` times.
#
#   bash bench/compare_torch.sh [rounds] [builds]   (needs python3-torch; see ../shared/bench/README.md)
#
#   builds: any of native avx2 portable (default: all three), each built here if needed:
#     native    build/               -march=native (this CPU's widest SIMD)
#     avx2      build-avx2/          -march=x86-64-v3, and OpenBLAS on its Haswell (AVX2) kernels for
#                                    both sides: the program an AVX2-only machine (Zen 3, Haswell) runs
#     portable  build-portable/      ARCH= (any x86-64: SSE2 only in our own loops)
#   (avx2 and portable are built with CUDA=0 MPI=0: the benchmarks use neither, and nvcc is slow)
#
# Per build and config it prints the GPT step's ratio ours/PyTorch from the minimum step time over
# every round (the least disturbed step; ratio_median beside it), ratio_cpu from the CPU time per
# step (median over rounds; the steadiest figure when other jobs share the cores), then each
# elementwise op's ratio, and the machine's load (uptime) when the figure was taken. GEMM against
# PyTorch follows for native.
#
# OpenBLAS picks its kernels from the CPU it sees. The machine's environment sets OPENBLAS_CORETYPE
# (to a slower kernel for old OpenBLAS builds), so it is unset for both sides; when OpenBLAS's own
# detection then falls back to its generic "Prescott" kernels (a CPU newer than the OpenBLAS build,
# or a VM hiding the model), SkylakeX or Haswell is set from the CPU's flags instead. The core used
# is printed with every result.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
builds=${2:-native avx2 portable}
shared=../shared/bench
torch_lib="LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread"
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch' 2>/dev/null || {
  echo "compare_torch: PyTorch is not installed (apt-get install -y python3-torch python3-numpy libopenblas0-pthread)" >&2
  exit 1
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
minimum() { sort -g | head -1; }
field() { sed -n "s/.*\"$1\": \"\{0,1\}\([0-9.e+-]*\).*/\1/p"; }
ratio() { awk -v o="$1" -v t="$2" 'BEGIN {printf "%.3f", o / t}'; }
load() { uptime | sed 's/.*load average: //'; }

# Runs "$@" and prints its output, then a last line with the CPU seconds (user + sys) it took.
cpu_seconds() {
  local out
  out=$(mktemp)
  /usr/bin/time -f "%U %S" -o "$out" "$@"
  awk '{print $1 + $2}' "$out"
  rm -f "$out"
}
# CPU ms per step from a default run (5 warm-up + 20 timed steps) and a --steps 1 run: their
# difference is 19 steps, with start-up and model building cancelled out. On a loaded machine the
# CPU time a step costs moves far less than its wall time, which includes waiting for a core.
per_step_cpu_ms() { awk -v long="$(tail -1 <<<"$1")" -v short="$(tail -1 <<<"$2")" 'BEGIN {printf "%.1f", (long - short) / 19 * 1000}'; }

# The OpenBLAS core the pthread build of OpenBLAS (ours and torch's) picks under environment "$@".
openblas_core() {
  env "$@" $torch_lib /usr/bin/python3 -c 'import ctypes; l = ctypes.CDLL("libopenblas.so.0");
l.openblas_get_corename.restype = ctypes.c_char_p; print(l.openblas_get_corename().decode())'
}
# OPENBLAS_CORETYPE for a build: Haswell for avx2; for the others OpenBLAS's own choice, unless that
# is the generic Prescott fallback.
coretype_for() {
  if [ "$1" = avx2 ]; then echo Haswell; return; fi
  local detected
  detected=$(openblas_core -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
  if [ "${detected,,}" != prescott ]; then echo ""; return; fi
  if grep -qw avx512f /proc/cpuinfo; then echo SkylakeX; elif grep -qw avx2 /proc/cpuinfo; then echo Haswell; fi
}

for build in $builds; do
  case $build in
    native) dir=build; arch=-march=native; extra=() ;;
    avx2) dir=build-avx2; arch=-march=x86-64-v3; extra=(CUDA=0 MPI=0) ;;
    portable) dir=build-portable; arch=; extra=(CUDA=0 MPI=0) ;;
    *) echo "compare_torch: unknown build '$build' (native, avx2 or portable)" >&2; exit 2 ;;
  esac
  make --no-print-directory "${extra[@]}" ARCH="$arch" BUILD=$dir $dir/bench/gemm $dir/bench/gpt_step $dir/bench/elementwise >/dev/null
  coretype=$(coretype_for $build)
  env_both="env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ${coretype:+OPENBLAS_CORETYPE=$coretype}"
  core=$(openblas_core -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ${coretype:+OPENBLAS_CORETYPE=$coretype})
  tag="\"build\": \"$build\", \"arch\": \"${arch:-portable}\", \"openblas_core\": \"$core\""

  for config in A B; do
    ours_min=(); ours_med=(); theirs_min=(); theirs_med=(); ours_cpu=(); theirs_cpu=()
    for ((r = 0; r < rounds; r++)); do
      line=$(cpu_seconds $env_both $dir/bench/gpt_step --config $config)
      ours_min+=("$(field min_ms <<<"$line")"); ours_med+=("$(field median_ms <<<"$line")")
      short=$(cpu_seconds $env_both $dir/bench/gpt_step --config $config --steps 1)
      ours_cpu+=("$(per_step_cpu_ms "$line" "$short")")
      line=$(cpu_seconds $env_both $torch_lib /usr/bin/python3 $shared/gpt_torch.py --config $config --threads 1)
      theirs_min+=("$(field min_s <<<"$line" | awk '{print $1 * 1000}')")
      theirs_med+=("$(field median_s <<<"$line" | awk '{print $1 * 1000}')")
      short=$(cpu_seconds $env_both $torch_lib /usr/bin/python3 $shared/gpt_torch.py --config $config --threads 1 --steps 1)
      theirs_cpu+=("$(per_step_cpu_ms "$line" "$short")")
    done
    o=$(printf '%s\n' "${ours_min[@]}" | minimum); t=$(printf '%s\n' "${theirs_min[@]}" | minimum)
    om=$(printf '%s\n' "${ours_med[@]}" | median); tm=$(printf '%s\n' "${theirs_med[@]}" | median)
    oc=$(printf '%s\n' "${ours_cpu[@]}" | median); tc=$(printf '%s\n' "${theirs_cpu[@]}" | median)
    echo "{\"bench\": \"gpt_step_vs_torch\", $tag, \"config\": \"$config\", \"threads\": 1, \"shardlab_min_ms\": $o, \"torch_min_ms\": $t, \"ratio\": $(ratio "$o" "$t"), \"ratio_median\": $(ratio "$om" "$tm"), \"shardlab_cpu_ms\": $oc, \"torch_cpu_ms\": $tc, \"ratio_cpu\": $(ratio "$oc" "$tc"), \"load\": \"$(load)\", \"min_runs\": \"${ours_min[*]} | ${theirs_min[*]}\"}"
  done

  # Elementwise ops: the best of 50 runs on each side; GELU also against torch's erf form, the
  # one gpt_torch.py's step runs.
  ours=$($env_both $dir/bench/elementwise --reps 50)
  theirs=$($env_both $torch_lib /usr/bin/python3 bench/elementwise_torch.py --reps 50)
  while read -r line; do
    op=$(sed -n 's/.*"op": "\([a-z_]*\)".*/\1/p' <<<"$line")
    o=$(field min_us <<<"$line")
    torch_ops=$op
    [[ $op != gelu_* ]] || torch_ops="$op ${op/gelu_/gelu_erf_}"
    for torch_op in $torch_ops; do
      t=$(grep "\"op\": \"$torch_op\"" <<<"$theirs" | field min_us)
      echo "{\"bench\": \"elementwise_vs_torch\", $tag, \"op\": \"$op\", \"torch_op\": \"$torch_op\", \"shardlab_us\": $o, \"torch_us\": $t, \"ratio\": $(ratio "$o" "$t"), \"load\": \"$(load)\"}"
    done
  done <<<"$ours"

  [ "$build" = native ] || continue
  for n in 256 512 1024 2048; do
    for threads in 1 2; do
      ours=(); theirs=()
      for ((r = 0; r < rounds; r++)); do
        ours+=("$($env_both $dir/bench/gemm --sizes $n --threads $threads | field gflops)")
        theirs+=("$($env_both $torch_lib /usr/bin/python3 $shared/gemm_torch.py --sizes $n --threads $threads --reps 10 | grep '^JSON' | field gflops_median)")
      done
      o=$(printf '%s\n' "${ours[@]}" | median); t=$(printf '%s\n' "${theirs[@]}" | median)
      echo "{\"bench\": \"gemm_vs_torch\", $tag, \"n\": $n, \"threads\": $threads, \"shardlab_gflops\": $o, \"torch_gflops\": $t, \"ratio\": $(ratio "$o" "$t")}"
    done
  done
done
