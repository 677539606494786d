#!/usr/bin/env bash
# deps.sh — finds what shardlab builds against; installs what is missing (as root) or says how.
#
#   Eigen 3.4 (headers), GoogleTest, nlohmann-json, CLI11 (the programs' command lines and TOML configs,
#   headers), OpenBLAS (GEMM), OpenMPI (the MPI backend), ccache
#   (the compiler cache the Makefile uses when it is there);
#   `deps.sh sanitize` also clang (the AddressSanitizer build compiles faster with it; g++ when it is absent);
#   `deps.sh fuzz` also clang and its libFuzzer runtime (make fuzz)
set -euo pipefail

missing=()
need() {  # need <debian-package> <file that proves it is there>
  [ -e "$2" ] || missing+=("$1")
}
need libeigen3-dev      /usr/include/eigen3/Eigen/Core
need libgtest-dev       /usr/include/gtest/gtest.h
need libgtest-dev       /usr/lib/x86_64-linux-gnu/libgtest.a
need nlohmann-json3-dev /usr/include/nlohmann/json.hpp
need libcli11-dev       /usr/include/CLI/CLI.hpp
need libopenblas-dev    /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h
need libopenblas-dev    /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so
need libopenmpi-dev     /usr/include/x86_64-linux-gnu/openmpi/mpi.h
need openmpi-bin        /usr/bin/mpirun
need ccache             /usr/bin/ccache
if [ "${1:-}" = sanitize ] && [ ! -e /usr/bin/clang++ ]; then
  if [ "$(id -u)" = 0 ]; then
    need clang /usr/bin/clang++
  else
    echo "deps: clang++ not found: the sanitizer build uses g++ (slower to compile); apt-get install clang" >&2
  fi
fi
if [ "${1:-}" = fuzz ]; then
  need clang              /usr/bin/clang++
  need libclang-rt-14-dev /usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.fuzzer-x86_64.a
fi

if [ ${#missing[@]} -gt 0 ]; then
  packages=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "deps: installing $packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq $packages >/dev/null
  else
    echo "deps: missing $packages" >&2
    echo "deps: install them with:  sudo apt-get install -y $packages" >&2
    exit 1
  fi
fi

# Eigen must be 3.4 or newer.
eigen_version=$(awk '/#define EIGEN_(WORLD|MAJOR|MINOR)_VERSION/ {printf "%s.", $3}' /usr/include/eigen3/Eigen/src/Core/util/Macros.h)
case "$eigen_version" in
  3.[4-9].*|[4-9].*) ;;
  *) echo "deps: Eigen ${eigen_version%.} found, 3.4 or newer needed (apt-get install libeigen3-dev)" >&2; exit 1 ;;
esac
