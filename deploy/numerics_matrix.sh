#!/usr/bin/env bash
# Reruns the tests labelled `numerics` under other CPU kernel families and
# thread counts: their results depend on rounding, which differs between
# CPUs, so this shows on one machine what the others would compute.
#
#   bash deploy/numerics_matrix.sh        # every kernel family this CPU runs
#   bash deploy/numerics_matrix.sh 2      # the first 2 not already in use
#
# A family sets the variable of each library that picks kernels by CPU:
# LibTorch's own kernels (ATEN_CPU_CAPABILITY: default, avx2, avx512), MKL,
# which PyPI's LibTorch has linked in (MKL_ENABLE_INSTRUCTIONS), its
# oneDNN, its bfloat16 GEMMs (ONEDNN_MAX_CPU_ISA), and OpenBLAS, which
# Debian's LibTorch runs on (OPENBLAS_CORETYPE); each library
# reads only its own. Each run alternates 1 and 2 threads
# (LORAPLEX_TEST_THREADS for the servers and workers tests start,
# OMP_NUM_THREADS, MKL_NUM_THREADS and OPENBLAS_NUM_THREADS for the test
# processes). Exits non-zero when any run fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

limit=${1:-0}
build=${LORAPLEX_BUILD_DIR:-build}
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]]; }

# Kernel families that run on this CPU, the generic one first, each as
# OpenBLAS core / ATen capability / MKL / oneDNN instruction set.
families=(Prescott/default/SSE4_2/SSE41)
if has avx2; then families+=(Haswell/avx2/AVX2/AVX2 Zen/avx2/AVX2/AVX2); fi
if has avx512f && has avx512bw; then families+=(SkylakeX/avx512/AVX512/AVX512_CORE); fi

runs=0
failed=()
threads=1
for family in "${families[@]}"; do
  IFS=/ read -r openblas aten mkl onednn <<< "$family"
  if [ "${OPENBLAS_CORETYPE:-}" = "$openblas" ]; then continue; fi
  if [ "$limit" -gt 0 ] && [ "$runs" -ge "$limit" ]; then break; fi
  runs=$((runs + 1))
  echo "==> numerics tests with OPENBLAS_CORETYPE=$openblas" \
    "ATEN_CPU_CAPABILITY=$aten MKL_ENABLE_INSTRUCTIONS=$mkl" \
    "ONEDNN_MAX_CPU_ISA=$onednn, $threads thread(s)"
  # OMP_WAIT_POLICY=PASSIVE: with 2 threads per process and -j2 running
  # multi-process tests side by side, OpenMP threads that spin while they
  # wait starve the other processes' ranks of the 2 cores until their
  # timeouts expire; sleeping threads do not, and rounding is the same.
  if ! env OPENBLAS_CORETYPE="$openblas" OPENBLAS_L2_SIZE=512 \
      ATEN_CPU_CAPABILITY="$aten" MKL_ENABLE_INSTRUCTIONS="$mkl" \
      ONEDNN_MAX_CPU_ISA="$onednn" \
      LORAPLEX_TEST_THREADS="$threads" OMP_NUM_THREADS="$threads" \
      MKL_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" \
      OMP_WAIT_POLICY=PASSIVE \
      ctest --test-dir "$build" --output-on-failure -j2 -L numerics -LE long; then
    failed+=("$family/$threads")
  fi
  threads=$((3 - threads))
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "numerics_matrix: failed under ${failed[*]}" >&2
  exit 1
fi
echo "numerics_matrix: $runs run(s) passed"
