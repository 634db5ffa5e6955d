#!/usr/bin/env bash
# Encoding speed of loraplex's tokenizer.json against HF tokenizers (the
# Rust library behind transformers) on the same corpus, single-threaded,
# runs alternating so machine noise hits both. Prints the ratio last.
#
#   python3 -m venv /tmp/tok && /tmp/tok/bin/pip install tokenizers==0.23.3
#   PYTHON=/tmp/tok/bin/python bash bench/tokenizer_vs_hf.sh [MODEL_DIR] [RUNS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fixtures=tests/fixtures/golden/tokenizers
model=${1:-$fixtures/llama3_like}
runs=${2:-5}
python=${PYTHON:-python3}
bench=${BENCH:-build/bin/loraplex-bench-tokenizer}
corpus=$fixtures/corpus.jsonl

"$python" -c 'import tokenizers' 2>/dev/null || {
  echo "tokenizer_vs_hf.sh: $python has no tokenizers package (see the" \
    "header of this script)" >&2
  exit 1
}
[ -x "$bench" ] || { echo "tokenizer_vs_hf.sh: build $bench first" >&2; exit 1; }

hf_run() {
  RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false "$python" - "$model" "$corpus" <<'PY'
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1] + "/tokenizer.json")
texts = [json.loads(line)["text"] for line in open(sys.argv[2], encoding="utf-8")]
tokens = 0
start = time.perf_counter()
for _ in range(5):
  for text in texts:
    tokens += len(tok.encode(text, add_special_tokens=False).ids)
seconds = time.perf_counter() - start
print(f"hf tokens_per_s={tokens / seconds:.0f} tokens={tokens} seconds={seconds:.3f}")
PY
}

ours=()
theirs=()
for ((i = 0; i < runs; i++)); do
  line=$("$bench" --model "$model" --corpus "$corpus" --passes 5)
  echo "$line"
  ours+=("$(sed -E 's/.*tokens_per_s=([0-9]+).*/\1/' <<<"$line")")
  line=$(hf_run)
  echo "$line"
  theirs+=("$(sed -E 's/.*tokens_per_s=([0-9]+).*/\1/' <<<"$line")")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ours_median=$(median "${ours[@]}")
theirs_median=$(median "${theirs[@]}")
awk -v a="$ours_median" -v b="$theirs_median" -v m="$model" 'BEGIN {
  printf "summary %s: loraplex %d tokens/s, HF tokenizers %d tokens/s, ratio %.2fx\n", m, a, b, a / b }'
