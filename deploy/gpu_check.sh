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
# PYTHON names the Python whose torch to build against (default: python3;
# with --cpu, the project's .venv when it has torch). LORAPLEX_GPU_BUILD
# names the build directory (default: build-gpu). Each step's log is in OUT;
# exits non-zero when a step fails, after writing what it has.
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
kit=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
build=${LORAPLEX_GPU_BUILD:-$src/build-gpu}
: > "$out/summary.txt"
start=$SECONDS
note() { echo "[$((SECONDS - start)) s] $*" | tee -a "$out/summary.txt"; }
fail() {
  note "FAILED: $1 (log: $2)"
  tail -40 "$2" >&2 || true
  exit 1
}

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

generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
with_cuda=ON
[ "$cpu" = 0 ] || with_cuda=OFF
note "configuring $build"
cmake -S "$src" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DTorch_DIR="$torch_cmake/Torch" -DLORAPLEX_TORCH_FROM_VENV=OFF \
  -DLORAPLEX_WITH_CUDA="$with_cuda" -DLORAPLEX_VENV="$build/no-venv" \
  > "$out/configure.log" 2>&1 || fail "configure" "$out/configure.log"

# What the check runs: the server, the GPU benchmark and the test programs
# with `cuda` cases (named *OnCuda*). On the GPU machine everything is
# built (its cores make that quick); the dry run builds just these.
targets=(loraplex-server loraplex-bench-gpu runtime_test train_test)
jobs=$(nproc 2>/dev/null || echo 2)
note "building with $jobs jobs"
if [ "$cpu" = 1 ]; then
  cmake --build "$build" -j"$jobs" --target "${targets[@]}" \
    > "$out/build.log" 2>&1 || fail "build" "$out/build.log"
else
  cmake --build "$build" -j"$jobs" > "$out/build.log" 2>&1 ||
    fail "build" "$out/build.log"
fi

"$build/bin/loraplex-server" --version > "$out/version.txt" 2>&1 ||
  fail "loraplex-server --version" "$out/version.txt"
note "$(tr '\n' ';' < "$out/version.txt")"

note "tests labelled cuda"
status=0
ctest --test-dir "$build" -L cuda --output-on-failure \
  > "$out/cuda_tests.log" 2>&1 || status=1
note "$(grep -E 'tests passed|tests failed' "$out/cuda_tests.log" || echo 'no result')"
grep -h "SKIPPED \]\|Skipped" "$out/cuda_tests.log" | head -20 >> "$out/summary.txt" || true

bench=("$build/bin/loraplex-bench-gpu")
if [ "$cpu" = 1 ]; then
  bench+=(--device cpu --shapes tiny --slots 1,4,16 --seq 32 --rounds 1)
else
  bench+=(--rounds 2)
fi
note "benchmark: ${bench[*]}"
if timeout 330 "${bench[@]}" > "$out/bench.log" 2>&1; then
  grep '^SUMMARY' "$out/bench.log" >> "$out/summary.txt" || true
else
  note "FAILED or timed out: benchmark (log: $out/bench.log)"
  status=1
fi
note "done, status $status"
exit "$status"
