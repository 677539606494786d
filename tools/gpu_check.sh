#!/usr/bin/env bash
# gpu_check.sh — everything shardlab runs on a GPU, in one go, with a summary at the end.
#
#   bash tools/gpu_check.sh            # BUILD=build (the default build directory), JOBS=$(nproc)
#
# 1. Builds what it needs: the library with the CUDA backend (and NCCL, when nccl.h is found), build/bin/train,
#    the benchmarks gemm, gpt_step and collectives, and `make test`'s binary of every test file (a list of
#    the files that hold GPU cases would have to be kept in step with tests/; the filters below pick the cases).
# 2. Runs the CUDA and NCCL tests (a gtest filter over their suites), the train CLI's GPU tests (--device cuda
#    against the CPU, one rank per GPU against CPU ranks), and with SL_TEST_DEVICE=cuda the suites that
#    opt in (tests/support/parallel.h): the GPT's on cuda:0; DDP, ZeRO-1/2 (and offload), FSDP/HSDP, TP, CP
#    (ring, all-gather, Ulysses, hybrid), N-D and the pipeline Trainer against serial, over NCCL when every rank has a GPU, else as
#    thread ranks sharing the GPUs through host staging (tests/parallel/comm/test_host_staging.cpp checks that first).
# 3. Runs the GPU benchmarks: sl::matmul on cuda:0 (cuBLAS SGEMM) against the best rate cuBLAS reached in the
#    same run (the measured peak: the engine's matmul IS cuBLAS), the GPT step on cuda:0 (and GPT-2 small's step
#    in f32 and bf16 with its model FLOPs utilisation, bench/model_flops.h, and its profile), and the all-reduce's
#    bus bandwidth over NCCL (nccl-tests' busbw = algbw x 2(n-1)/n) when there are 2 GPUs or more.
# 4. Prints a summary: tests passed / failed / skipped, and the key figures.
#
# Without a GPU it still builds everything above (so that the CUDA code is known to compile), checks that
# the GPU benchmarks refuse cleanly ("no CUDA device: ..."), says that no GPU is present and exits 0.
# Exit status: 1 when a build fails, or (with a GPU) a test fails or a benchmark does not run.
set -uo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
JOBS=${JOBS:-$(nproc)}
LOG_DIR=$BUILD/gpu_check
mkdir -p "$LOG_DIR"
GPU_TESTS=$BUILD/tests/shardlab_tests
# Host staging, the CUDA and NCCL suites, and the train CLI's GPU tests (their names say Gpu).
FILTER='HostStaging*:Cuda*:*/Cuda*:Nccl*:*/Nccl*:TrainCli.*Gpu*:TrainCli.Cuda*:TrainOptions.Cuda*'

say() { printf '\n=== %s\n' "$*"; }
failures=0

# ---- 1. build ----------------------------------------------------------------------------------------
say "build ($BUILD, -j$JOBS): library, train, benchmarks, $GPU_TESTS"
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "gpu_check: nvcc not found: the CUDA backend cannot be built (install the CUDA toolkit)"
  exit 1
fi
if ! nice make --no-print-directory -j"$JOBS" CUDA=1 BUILD="$BUILD" \
    "$BUILD/bin/train" "$BUILD/bench/gemm" "$BUILD/bench/gpt_step" "$BUILD/bench/collectives" "$GPU_TESTS" \
    >"$LOG_DIR/build.log" 2>&1; then
  tail -n 30 "$LOG_DIR/build.log"
  echo "gpu_check: the build failed (log: $LOG_DIR/build.log)"
  exit 1
fi
echo "built (log: $LOG_DIR/build.log)"
grep -q -- '-DSL_WITH_NCCL' "$BUILD/.flags" && nccl=yes || nccl=no
echo "NCCL backend built: $nccl"

# How many GPUs the CUDA runtime sees: the gemm benchmark asks it (cuda_info), so no nvidia-smi is needed.
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
probe=$("$BUILD/bench/gemm" --device cuda --sizes 64 --reps 1 --warmup 0 2>&1)
probe_status=$?
if [ $probe_status -eq 0 ] && [ "$gpus" -eq 0 ]; then
  gpus=1  # a GPU ran the GEMM, and nvidia-smi is not here to count them
elif [ $probe_status -ne 0 ]; then
  gpus=0
  case "$probe" in
    *"no CUDA device"*) ;;
    *) echo "$probe"; echo "gpu_check: bench/gemm --device cuda failed in an unexpected way"; exit 1 ;;
  esac
fi

# ---- 2. tests --------------------------------------------------------------------------------------
# gtest's closing lines: "[  PASSED  ] 12 tests.", "[  SKIPPED ] 3 tests, listed below:", "[  FAILED  ] 1 test, ..."
count() { grep -Eo "^\[  $1 *\] [0-9]+ test" "$2" | grep -Eo '[0-9]+' | tail -n 1 || true; }
passed=0 skipped=0 failed=0
run_tests() {  # name, log, then the command
  local name=$1 log=$2
  shift 2
  "$@" >"$log" 2>&1
  local status=$?
  local p s f
  p=$(count PASSED "$log"); s=$(count SKIPPED "$log"); f=$(count FAILED "$log")
  p=${p:-0} s=${s:-0} f=${f:-0}
  if [ $status -ne 0 ] && [ "$f" = 0 ]; then f=1; fi  # a crash: no summary line
  passed=$((passed + p)) skipped=$((skipped + s)) failed=$((failed + f))
  printf '%-34s passed %3d  skipped %3d  failed %3d   (log: %s)\n' "$name" "$p" "$s" "$f" "$log"
  [ "$f" = 0 ] || { grep -E '^\[  FAILED  \]' "$log" | head -n 20; failures=$((failures + 1)); }
}
say "tests (GPUs visible: $gpus)"
run_tests "CUDA, NCCL and train --device cuda" "$LOG_DIR/tests.log" \
  env SL_TRAIN_BIN="$BUILD/bin/train" "$GPU_TESTS" --gtest_filter="$FILTER"
run_tests "parity suites: SL_TEST_DEVICE=cuda" "$LOG_DIR/tests_device_cuda.log" \
  env SL_TEST_DEVICE=cuda "$GPU_TESTS" --gtest_filter='GPT.*:Layouts/DataParallel.*:Stages/Zero.MatchesSerial/*:Layouts/Fsdp.*:Layouts/Hsdp.*:Layouts/TensorParallelParity.*:Layouts/ContextParallelParity.*:Layouts/NdParallelParity.*:Layouts/PipelineTrainer.*'

if [ "$gpus" -eq 0 ]; then
  say "no GPU"
  # The benchmarks must refuse, naming why, rather than run on the CPU or crash.
  for bench in "gemm --device cuda" "gpt_step --device cuda --steps 1 --warmup 0" "collectives --backend nccl"; do
    out=$("$BUILD/bench/"$bench 2>&1)
    status=$?
    if [ $status -eq 1 ] && [[ "$out" == *"no CUDA device"* ]]; then
      echo "bench/$bench: refuses: ${out%%$'\n'*}"
    else
      echo "bench/$bench: expected exit 1 and 'no CUDA device', got exit $status: $out"
      failures=$((failures + 1))
    fi
  done
  say "summary"
  echo "no GPU is present (the CUDA runtime found none): everything compiled; the GPU tests skipped"
  echo "tests: $passed passed, $skipped skipped, $failed failed"
  [ $failures -eq 0 ] && exit 0
  echo "gpu_check: $failures check(s) failed"
  exit 1
fi

# ---- 3. benchmarks -----------------------------------------------------------------------------------
say "benchmarks"
figures=()
if "$BUILD/bench/gemm" --device cuda >"$LOG_DIR/gemm.jsonl" 2>&1; then
  cat "$LOG_DIR/gemm.jsonl"
  figures+=("$(python3 - "$LOG_DIR/gemm.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
big = max(rows, key=lambda r: r["n"])
print(f"GEMM f32 on cuda:0: {big['gflops'] / 1e3:.1f} TFLOP/s median at n={big['n']}, "
      f"{100 * big['of_peak']:.0f}% of the best cuBLAS SGEMM rate measured ({big['peak_gflops'] / 1e3:.1f} TFLOP/s)")
EOF
)")
else
  cat "$LOG_DIR/gemm.jsonl"; failures=$((failures + 1))
  figures+=("GEMM: FAILED (log: $LOG_DIR/gemm.jsonl)")
fi
if "$BUILD/bench/gpt_step" --device cuda >"$LOG_DIR/gpt_step.jsonl" 2>&1; then
  cat "$LOG_DIR/gpt_step.jsonl"
  figures+=("$(python3 - "$LOG_DIR/gpt_step.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print("GPT step on cuda:0: " + ", ".join(f"config {r['config']} {r['median_ms']:.2f} ms median ({r['min_ms']:.2f} min)"
                                          for r in rows if r["bench"] == "gpt_step"))
EOF
)")
else
  cat "$LOG_DIR/gpt_step.jsonl"; failures=$((failures + 1))
  figures+=("GPT step: FAILED (log: $LOG_DIR/gpt_step.jsonl)")
fi
# MFU at GPT-2 small's shape (V 50,257, T 1024, B 8) in f32 and bf16, with the profile of what remains.
if "$BUILD/bench/gpt_step" --device cuda --config gpt2 --mixed-precision bf16 --steps 10 --warmup 3 --rounds 1 \
    --profile >"$LOG_DIR/gpt2_mfu.jsonl" 2>&1; then
  cat "$LOG_DIR/gpt2_mfu.jsonl"
  figures+=("$(python3 - "$LOG_DIR/gpt2_mfu.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"bench": "gpt_step"')]
print("GPT-2 small step on cuda:0 (V 50257, T 1024, B 8): " + ", ".join(
    f"{r['mixed_precision']} {r['median_ms']:.1f} ms, {r['model_tflops']:.1f} TFLOP/s"
    + (f", MFU {100 * r['mfu']:.1f}% of {r['peak_tflops']:.0f}" if "mfu" in r else ", MFU: peak unknown")
    for r in rows))
EOF
)")
else
  cat "$LOG_DIR/gpt2_mfu.jsonl"; failures=$((failures + 1))
  figures+=("GPT-2 small MFU: FAILED (log: $LOG_DIR/gpt2_mfu.jsonl)")
fi
if [ "$gpus" -lt 2 ]; then
  figures+=("all-reduce over NCCL: not run (needs 2 GPUs, $gpus visible)")
elif [ "$nccl" = no ]; then
  figures+=("all-reduce over NCCL: not run (this build has no NCCL backend: nccl.h was not found)")
elif "$BUILD/bench/collectives" --backend nccl --sizes-mib 1,64,256 >"$LOG_DIR/collectives.jsonl" 2>&1; then
  cat "$LOG_DIR/collectives.jsonl"
  figures+=("$(python3 - "$LOG_DIR/collectives.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
best = {}
for r in rows:
    if r["busbw_GBps"] > best.get(r["world"], {"busbw_GBps": -1})["busbw_GBps"]:
        best[r["world"]] = r
print("all-reduce over NCCL, best busbw: " + ", ".join(
    f"{n} GPUs {r['busbw_GBps']:.1f} GB/s at {r['bytes'] >> 20} MiB (device copy {r['memcpy_GBps']:.0f} GB/s)"
    for n, r in sorted(best.items())))
EOF
)")
else
  cat "$LOG_DIR/collectives.jsonl"; failures=$((failures + 1))
  figures+=("all-reduce over NCCL: FAILED (log: $LOG_DIR/collectives.jsonl)")
fi

# ---- 4. summary --------------------------------------------------------------------------------------
say "summary ($gpus GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | xargs))"
echo "tests: $passed passed, $skipped skipped, $failed failed"
for figure in "${figures[@]}"; do echo "$figure"; done
[ $failures -eq 0 ] && { echo "gpu_check: OK"; exit 0; }
echo "gpu_check: $failures check(s) failed"
exit 1
