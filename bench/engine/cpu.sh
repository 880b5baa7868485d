#!/usr/bin/env bash
# CPU engine speed, smelt vs llama.cpp (llama-cpp-python 0.3.36) in the same run: prompt
# processing of 512 tokens (pp512) and decoding 128 tokens (tg128), on THREADS threads
# (default 2), both test models, the same prompt ids for both. Best of REPS (default 2) runs
# each, llama.cpp and smelt alternating. Prints a table, ratios (smelt / llama.cpp) last.
# Usage: bench/engine/cpu.sh [THREADS] [REPS]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
threads=${1:-2}
reps=${2:-2}
n_prompt=512
n_decode=128
py=${SMELT_PYTHON:-$(scripts/oracles.sh | tail -n1)}
if ! "$py" -c "import llama_cpp" 2>/dev/null; then
  echo "cpu.sh: no llama-cpp-python at $py (set SMELT_PYTHON): run scripts/oracles.sh" >&2
  exit 1
fi
cargo build --release -q -p smelt
smelt=$root/target/release/smelt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Other work on a 2-core machine ruins both sides' numbers (ggml's workers spin): wait up to
# IDLE_WAIT seconds (default 120) for the CPUs to be 90% idle before each model, and print
# the load average so a recorded run shows how quiet the machine was.
cpu_idle_pct() { # idle share of all CPUs over 2 s, from /proc/stat
  local a b total=0 i
  read -r -a a < /proc/stat; sleep 2; read -r -a b < /proc/stat
  for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
  echo $(( 100 * (b[4] + b[5] - a[4] - a[5]) / (total > 0 ? total : 1) ))
}
wait_idle() {
  local deadline=$((SECONDS + ${IDLE_WAIT:-120})) idle
  while idle=$(cpu_idle_pct); [ "$idle" -lt 90 ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "==> machine still busy (${idle}% idle), measuring anyway" >&2
      return
    fi
  done
  echo "==> CPUs ${idle}% idle" >&2
}
echo "==> $(date -u '+%Y-%m-%d %H:%M UTC'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), commit $(git rev-parse --short HEAD), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2

rows=()
for name in smollm2-135m gemma3-270m; do
  wait_idle
  model=$(scripts/fetch-models.sh "$name" | tail -n1)
  # A 512-token prompt: the perplexity text, tokenized by llama.cpp, cut to 512 ids.
  "$py" - "$model" crates/smelt/tests/data/perplexity.txt "$n_prompt" > "$tmp/ids" 2>/dev/null <<'PY'
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
ids = llm.tokenize(open(sys.argv[2], "rb").read(), add_bos=True, special=False)[: int(sys.argv[3])]
print(",".join(map(str, ids)))
PY
  [ "$(tr ',' '\n' < "$tmp/ids" | wc -l)" -eq "$n_prompt" ] || { echo "cpu.sh: the text is shorter than $n_prompt tokens" >&2; exit 1; }
  s_pp=0; s_tg=0; l_pp=0; l_tg=0
  for _ in $(seq "$reps"); do
    l=$("$py" bench/engine/llamacpp_speed.py "$model" "$tmp/ids" "$n_decode" "$threads" 1 2>/dev/null | tail -n1)
    s=$("$smelt" run --model "$model" --prompt-ids "$(cat "$tmp/ids")" --max-tokens "$n_decode" \
        --ignore-eog --threads "$threads" --ctx $((n_prompt + n_decode + 16)) --json | tail -n1)
    read -r lp lt < <(echo "$l" | "$py" -c 'import json,sys; v=json.load(sys.stdin); print(v["pp"], v["tg"])')
    read -r sp st < <(echo "$s" | "$py" -c 'import json,sys; t=json.load(sys.stdin)["timings"]; print(t["prompt_tokens_per_s"], t["decode_tokens_per_s"])')
    best() { "$py" -c "print(max($1, $2))"; }
    l_pp=$(best "$l_pp" "$lp"); l_tg=$(best "$l_tg" "$lt")
    s_pp=$(best "$s_pp" "$sp"); s_tg=$(best "$s_tg" "$st")
  done
  rows+=("$name $s_pp $l_pp $s_tg $l_tg")
done

echo "==> done $(date -u '+%H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$py" - "$threads" "${rows[@]}" <<'PY'
import sys
threads = sys.argv[1]
print(f"CPU engine, {threads} threads, tokens/s (best of runs); ratio = smelt / llama.cpp")
print(f"{'model':<14} {'smelt pp512':>12} {'llama pp512':>12} {'smelt tg128':>12} {'llama tg128':>12} {'pp ratio':>9} {'tg ratio':>9}")
for row in sys.argv[2:]:
    name, sp, lp, st, lt = row.split()
    sp, lp, st, lt = map(float, (sp, lp, st, lt))
    print(f"{name:<14} {sp:>12.1f} {lp:>12.1f} {st:>12.1f} {lt:>12.1f} {sp / lp:>8.2f}x {st / lt:>8.2f}x")
PY
