#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ (clang, ASan + UBSan) into
# build-fuzz/ and runs each on a working copy of its committed corpus
# (tests/fuzz/corpus/<target>/, made by tools/make_fuzz_corpus.py).
#
#   bash tools/fuzz.sh               each target for 1,000,000 executions
#   bash tools/fuzz.sh --runs N      each for N executions
#   bash tools/fuzz.sh --seconds S   each for S seconds (CI: 60)
#
# Prints each target's executions. A crash, a sanitizer report, a leak or a
# timeout stops it with the fuzzer's report, exit status 1, and the input
# that did it in build-fuzz/crashes/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

limit=(-runs=1000000)
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) limit=(-runs="$2"); shift 2 ;;
    --seconds) limit=(-max_total_time="$2"); shift 2 ;;
    *) echo "usage: $0 [--runs N | --seconds S]" >&2; exit 2 ;;
  esac
done

build=build-fuzz
if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -DLORAPLEX_FUZZ=ON \
    -DLORAPLEX_BUILD_TESTS=OFF -DLORAPLEX_BUILD_BENCH=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$build.configure.log" 2>&1 ||
    { cat "$build.configure.log"; exit 1; }
fi
cmake --build "$build" -j"$(nproc)" --target loraplex_fuzzers

mkdir -p "$build/crashes"
status=0
for target in dataset_fuzz tokenizer_json_fuzz peft_config_fuzz \
              safetensors_fuzz step_plan_fuzz openai_request_fuzz; do
  work="$build/corpus/$target"
  mkdir -p "$work"
  cp tests/fuzz/corpus/"$target"/* "$work"/
  # LibTorch's static state is never freed: no leak checks where it links.
  leaks=1
  case "$target" in safetensors_fuzz|step_plan_fuzz) leaks=0 ;; esac
  log="$build/$target.log"
  if ASAN_OPTIONS="detect_leaks=$leaks:allocator_may_return_null=1" \
     UBSAN_OPTIONS="print_stacktrace=1" \
     "$build/fuzz/$target" "${limit[@]}" -max_len=8192 -timeout=25 \
       -rss_limit_mb=4096 -print_final_stats=1 \
       -artifact_prefix="$build/crashes/$target-" "$work" > "$log" 2>&1; then
    executions=$(grep -o 'number_of_executed_units: *[0-9]*' "$log" |
                 grep -o '[0-9]*$' || echo "?")
    echo "$target: $executions executions, no crash"
  else
    echo "$target: FAILED (report below; the input is in $build/crashes/)"
    tail -60 "$log"
    status=1
  fi
done
exit "$status"
