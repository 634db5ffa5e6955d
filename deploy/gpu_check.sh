#!/usr/bin/env bash
# The prepared GPU check: on a machine with an NVIDIA GPU, PyTorch 2.x, CUDA,
# cmake and ninja (no package registries needed), builds loraplex against
# that machine's own torch and the kit deploy/gpu_kit.sh made, runs the
# tests labelled `cuda` and the GPU benchmark, and writes logs and results
# to OUT (summary.txt first).
#
#   bash deploy/gpu_check.sh KIT OUT          # on the GPU machine
#   bash deploy/gpu_check.sh --cpu KIT OUT    # the same steps on a CPU-only
#                                             # machine, smaller: a dry run
#
# KIT is the kit's folder or its archive (gpu-kit.tar.xz). PYTHON names the
# Python whose torch to build against (default: python3; with --cpu, the
# project's .venv when it has torch). LORAPLEX_GPU_BUILD names the build
# directory (default: build-gpu); a second run reuses it. LORAPLEX_GPU_BENCH
# replaces the benchmark's arguments, LORAPLEX_GPU_BENCH_SECONDS its time
# limit (default 300), LORAPLEX_GPU_TEST_SECONDS each test program's (300);
# LORAPLEX_GPU_STEPS=build,tests,bench picks the steps. The benchmark
# profiles one step of 16 slots per shape and the 16 Muon slots' optimizer
# step (tables in bench.log, Chrome traces in profiles.tar.xz).
# Each step's log is in OUT: at most 8 files (summary.txt, nvidia-smi.txt,
# version.txt, build.log with the configure output, cuda_tests.log,
# runtime_tests.log, bench.log, profiles.tar.xz). A build that fails part-way still runs the
# tests that were built (the others show as not built); exits non-zero when
# any step failed, after writing what it has.
set -euo pipefail

cpu=0
if [ "${1:-}" = "--cpu" ]; then
  cpu=1
  shift
fi
if [ $# -ne 2 ]; then
  echo "usage: $0 [--cpu] KIT OUT" >&2
  exit 2
fi
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
build=${LORAPLEX_GPU_BUILD:-$src/build-gpu}
steps=",${LORAPLEX_GPU_STEPS:-build,tests,bench},"
: > "$out/summary.txt"
start=$SECONDS
note() { echo "[$((SECONDS - start)) s] $*" | tee -a "$out/summary.txt"; }
fail() {
  note "FAILED: $1 (log: $2)"
  tail -40 "$2" >&2 || true
  exit 1
}

if [ -d "$1" ]; then
  kit=$(cd "$1" && pwd)
elif [ -f "$1" ]; then
  # The archive unpacks once per build directory.
  mkdir -p "$build"
  if [ ! -f "$build/kit/env.sh" ]; then
    rm -rf "$build/kit.tmp"
    mkdir -p "$build/kit.tmp"
    tar -C "$build/kit.tmp" -xf "$1" || fail "unpacking the kit $1" /dev/null
    inner=$(find "$build/kit.tmp" -maxdepth 2 -name env.sh -printf '%h\n' |
            head -1)
    [ -n "$inner" ] || fail "no env.sh in the kit $1" /dev/null
    rm -rf "$build/kit"
    mv "$inner" "$build/kit"
    rm -rf "$build/kit.tmp"
  fi
  kit=$build/kit
else
  fail "no kit at $1 (run deploy/gpu_kit.sh)" /dev/null
fi

python=${PYTHON:-python3}
if [ -z "${PYTHON:-}" ] && [ "$cpu" = 1 ] && [ -x "$src/.venv/bin/python" ]; then
  python=$src/.venv/bin/python
fi
# shellcheck source=/dev/null
source "$kit/env.sh"
torch_cmake=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)') ||
  fail "no torch in $python" /dev/null
note "torch $("$python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)') from $python"
{ nvidia-smi || echo "no nvidia-smi"; } > "$out/nvidia-smi.txt" 2>&1
jobs=$(nproc 2>/dev/null || echo 2)
status=0

if [[ "$steps" == *,build,* ]]; then
  cxx=$(command -v "${CXX:-c++}") || fail "no C++ compiler (CXX, c++)" /dev/null
  note "compiler $cxx: $("$cxx" --version | head -1)"
  generator=()
  keep_going=()
  if command -v ninja >/dev/null 2>&1; then
    generator=(-G Ninja)
    keep_going=(-- -k 0)
  fi
  with_cuda=ON
  [ "$cpu" = 0 ] || with_cuda=OFF
  note "configuring $build"
  cmake -S "$src" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER="$cxx" \
    -DTorch_DIR="$torch_cmake/Torch" -DLORAPLEX_TORCH_FROM_VENV=OFF \
    -DLORAPLEX_WITH_CUDA="$with_cuda" -DLORAPLEX_VENV="$build/no-venv" \
    > "$out/build.log" 2>&1 || fail "configure" "$out/build.log"
  grep -i "protobuf headers\|LibTorch .* at " "$out/build.log" |
    sed 's/^-- //' >> "$out/summary.txt" || true

  # What the check runs: the server, the GPU benchmark and the test programs
  # with `cuda` cases (named *OnCuda*); LORAPLEX_GPU_BUILD_ALL=1 builds
  # everything.
  target_args=(--target loraplex-server loraplex loraplex-bench-gpu
               runtime_test train_test optim_test model_test checkpoint_test
               service_test)
  if [ "${LORAPLEX_GPU_BUILD_ALL:-0}" = 1 ]; then target_args=(); fi
  note "building with $jobs jobs"
  build_start=$SECONDS
  if cmake --build "$build" -j"$jobs" "${target_args[@]}" "${keep_going[@]}" \
      >> "$out/build.log" 2>&1; then
    note "built in $((SECONDS - build_start)) s"
  else
    status=1
    note "FAILED: build, after $((SECONDS - build_start)) s (log:" \
      "$out/build.log); running what was built"
    grep -E "error|FAILED" "$out/build.log" | head -20 >> "$out/summary.txt" ||
      true
  fi
fi

if [ -x "$build/bin/loraplex-server" ]; then
  "$build/bin/loraplex-server" --version > "$out/version.txt" 2>&1 || true
  note "$(tr '\n' ';' < "$out/version.txt")"
fi

if [[ "$steps" == *,tests,* ]]; then
  note "tests labelled cuda"
  ctest --test-dir "$build" -L cuda --output-on-failure -j4 \
    --timeout "${LORAPLEX_GPU_TEST_SECONDS:-300}" \
    > "$out/cuda_tests.log" 2>&1 || status=1
  note "$(grep -E 'tests passed|tests failed' "$out/cuda_tests.log" ||
    echo 'no result')"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|Not Run|SEGFAULT|Subprocess)" \
    "$out/cuda_tests.log" >> "$out/summary.txt" || true
  grep -h "SKIPPED \]\|Skipped" "$out/cuda_tests.log" | head -20 \
    >> "$out/summary.txt" || true
  # The programs call the C++ runtime's std::filesystem, not the copy this
  # machine's torch exports (CMakeLists.txt; it crashed in remove_all here).
  note "C++ runtime binding and checkpoint pruning"
  ctest --test-dir "$build" -R '^(RuntimeInfoTest|CheckpointTest)$' \
    --output-on-failure > "$out/runtime_tests.log" 2>&1 || status=1
  note "$(grep -E 'tests passed|tests failed' "$out/runtime_tests.log" ||
    echo 'no result')"
fi

if [[ "$steps" == *,bench,* ]]; then
  bench=("$build/bin/loraplex-bench-gpu")
  if [ -n "${LORAPLEX_GPU_BENCH:-}" ]; then
    read -r -a bench_args <<< "$LORAPLEX_GPU_BENCH"
    bench+=("${bench_args[@]}")
  elif [ "$cpu" = 1 ]; then
    bench+=(--device cpu --shapes tiny --slots 1,4,16 --seq 32 --rounds 1
            --short-shape tiny --short-slots 4,16 --short-seq 16
            --profile "$out/profiles")
  else
    bench+=(--rounds 2 --profile "$out/profiles")
  fi
  note "benchmark: ${bench[*]}"
  if timeout "${LORAPLEX_GPU_BENCH_SECONDS:-300}" "${bench[@]}" \
      > "$out/bench.log" 2>&1; then
    grep '^SUMMARY' "$out/bench.log" >> "$out/summary.txt" || true
  else
    note "FAILED or timed out: benchmark (log: $out/bench.log)"
    grep '^SUMMARY\|tokens/s' "$out/bench.log" | tail -20 \
      >> "$out/summary.txt" || true
    status=1
  fi
  # The profiled steps' Chrome traces, packed as one file (they are large
  # and compress well); the tables are in bench.log.
  if [ -d "$out/profiles" ]; then
    tar -C "$out" -cJf "$out/profiles.tar.xz" profiles && rm -rf "$out/profiles"
    note "profiles: $out/profiles.tar.xz (Chrome traces; tables in bench.log)"
  fi
fi
note "done, status $status"
exit "$status"
