#!/usr/bin/env bash
# `smelt serve` under 8/32/64 concurrent streams beside llama.cpp's batched decode and
# `smelt bench --batch`, in one device call, all three on the same file: a random
# Llama-3-8B-shape Q4_K written there by `smelt synth --tokenizer-from` (so the server can
# load it; the vocabulary, and so the output matrix, is the tokenizer's: SmolLM2's 49,152
# instead of Llama 3's 128,256).
#
# Here:  ../shared/peer/prepare.sh .peer; mkdir -p .gpu-serve; gzip -9 -c SMELT > .gpu-serve/smelt.gz;
#        .gpu-serve/tok.gguf: a GGUF holding only a tokenizer (`python bench/gpu/tok_gguf.py
#        .models/SmolLM2-135M-Instruct.Q4_1.gguf .gpu-serve/tok.gguf`; any GGUF with one will do,
#        but a real model is too large to carry beside .peer)
# There: bash bench/gpu/serve.sh    carry [".gpu-serve", ".peer"]   (about 8 minutes)
# Environment there: LEVELS (default "8 32 64"); SERVE_VARIANTS, `smelt serve` flags to
# compare, separated by `|` (default: one variant, no flags; e.g. "--step-tokens 256|"),
# each a row per level. Log: $OUT/serve.log (or bench/out), the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/serve.log"
S=/tmp/smelt
gunzip -c .gpu-serve/smelt.gz > $S && chmod +x $S
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; } | tee "$log"
echo "== llama.cpp build (+ its pp512/tg128 on its own file)" | tee -a "$log"
bash .peer/gpu-llamacpp.sh .peer llama3-8b Q4_K 2>&1 | tee -a "$log"
export PYTHONPATH=/tmp/site
m=/tmp/serve-llama3-8b-q4_k.gguf
$S synth --shape llama3-8b --quant q4_k --tokenizer-from .gpu-serve/tok.gguf -o $m 2>&1 | tail -1 | tee -a "$log"
levels=${LEVELS:-8 32 64}
table="$out/serve-table.md"
echo "| sequences | serve flags | llama.cpp batched tok/s | smelt bench --batch tok/s | smelt serve tok/s | serve median TTFT ms | serve per-stream tok/s x streams | serve host share | serve / llama.cpp | per-stream x streams / llama.cpp |" > "$table"
echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|" >> "$table"
IFS='|' read -r -a variants <<< "${SERVE_VARIANTS:-}"
[ ${#variants[@]} -gt 0 ] || variants=("")
sv_all=${SERVE_VARIANTS:-}
[ "${sv_all: -1}" = "|" ] && variants+=("")
for i in "${!variants[@]}"; do
  echo "== serve ${variants[$i]:-(defaults)}" | tee -a "$log"
  python3 bench/server/concurrency.py --serve "$S serve -m $m --device cuda --max-batch 64 ${variants[$i]}" \
    --levels 1,$(echo $levels | tr ' ' ',') --json 2>>"$log" | tee -a "$log" > /tmp/serve-$i.jsonl
done
for n in $levels; do
  lc=$(python3 .peer/llamacpp_batched.py $m $n 128 128 2>/dev/null | tee -a "$log" | grep RESULT | sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p')
  sb=$($S bench --model $m --device cuda --prompt 128 --gen 128 --reps 1 --batch $n --json 2>>"$log" | tr -d '\n' | grep -o '"batch_decode_tok_s":[0-9.]*' | cut -d: -f2)
  echo "smelt bench --batch $n: $sb" | tee -a "$log"
  for i in "${!variants[@]}"; do
    read -r sv ttft ps hs < <(python3 -c "
import json,sys
for l in open('/tmp/serve-$i.jsonl'):
    try: d=json.loads(l)
    except Exception: continue
    if d.get('streams')==$n: print(round(d.get('tok_s',0),1), round(d.get('ttft_ms',0),1), round(d.get('stream_tok_s',0)*$n,1), f\"{100*(d.get('host_share') or 0):.1f}%\")
")
    r=$(python3 -c "print(f'{float(\"$sv\")/float(\"$lc\"):.2f}x')" 2>/dev/null || echo -)
    r2=$(python3 -c "print(f'{float(\"$ps\")/float(\"$lc\"):.2f}x')" 2>/dev/null || echo -)
    echo "| $n | ${variants[$i]:-defaults} | ${lc:--} | ${sb:--} | ${sv:--} | ${ttft:--} | ${ps:--} | ${hs:--} | $r | $r2 |" >> "$table"
  done
done
echo "== table" | tee -a "$log"
grep -h "^{" /tmp/serve-*.jsonl | grep '"streams": 1,' | tee -a "$log"
tee -a "$log" < "$table"
