#!/usr/bin/env bash
# Reruns the tests labelled `numerics` under other OpenBLAS kernel families
# (OPENBLAS_CORETYPE) and thread counts: their results depend on rounding,
# which differs between CPUs, so this shows on one machine what the others
# would compute.
#
#   bash deploy/numerics_matrix.sh        # every kernel family this CPU runs
#   bash deploy/numerics_matrix.sh 2      # the first 2 not already in use
#
# Each run alternates 1 and 2 threads (LORAPLEX_TEST_THREADS for the servers
# and workers tests start, OMP_NUM_THREADS and OPENBLAS_NUM_THREADS for the
# test processes). Exits non-zero when any run fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

limit=${1:-0}
build=${LORAPLEX_BUILD_DIR:-build}
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]]; }

# Kernel families that run on this CPU, the generic one first.
families=(Prescott)
if has avx2; then families+=(Haswell Zen); fi
if has avx512f && has avx512bw; then families+=(SkylakeX); fi

runs=0
failed=()
threads=1
for family in "${families[@]}"; do
  if [ "${OPENBLAS_CORETYPE:-}" = "$family" ]; then continue; fi
  if [ "$limit" -gt 0 ] && [ "$runs" -ge "$limit" ]; then break; fi
  runs=$((runs + 1))
  echo "==> numerics tests with OPENBLAS_CORETYPE=$family, $threads thread(s)"
  if ! env OPENBLAS_CORETYPE="$family" OPENBLAS_L2_SIZE=512 \
      LORAPLEX_TEST_THREADS="$threads" OMP_NUM_THREADS="$threads" \
      OPENBLAS_NUM_THREADS="$threads" \
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
