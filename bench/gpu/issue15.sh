#!/usr/bin/env bash
# Issue 15's table in one device call on one GPU: `bench/gpu/peer.sh` (llama.cpp built
# here from ../shared/peer, its random Llama-3-8B-shape Q4_K file: pp512, tg128, pp4096,
# aggregate decode of 8/32/64 sequences, llama.cpp and smelt side by side; the
# batch-invariant checks skipped), then the same prompt, decode and batched-decode rows on
# each file of EXTRA (default "q4_k_m q8_0": `smelt synth --quant q4_k_m` has Q6_K attn_v,
# ffn_down in half the layers and the head, the mixture real Q4_K_M files have), llama.cpp
# and smelt on that same file. SHAPE (default llama3-8b; qwen3-32b) picks the shape of all
# files. About 510 s with both extras on an H100; EXTRA=q4_k_m for the 388 s of before.
#
# Here:  ../shared/peer/prepare.sh .peer; mkdir -p .gpu-peer;
#        strip + gzip -9 the release smelt into .gpu-peer/smelt.gz
# There: timeout 590 bash bench/gpu/issue15.sh    carry [".gpu-peer", ".peer"]
# Log: $OUT/peer.log and $OUT/issue15.log (or bench/out); both tables last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/issue15.log"
S=/tmp/smelt-i15
gunzip -c .gpu-peer/smelt.gz > $S && chmod +x $S
SECONDS=0
extra=${EXTRA:-q4_k_m q8_0}
(for q in $extra; do $S synth --shape "${SHAPE:-llama3-8b}" --quant $q -o /tmp/i15-$q.gguf; done > /tmp/i15-synth.log 2>&1) &
synpid=$!
SKIP_INVARIANT=1 bash bench/gpu/peer.sh > /tmp/i15-peer.out 2>&1
echo "peer.sh done at $SECONDS s" | tee "$log"
wait $synpid
cat /tmp/i15-synth.log >> "$log"
export PYTHONPATH=/tmp/site
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
rows=()
row() { # quant name llama smelt
  local r
  r=$(python3 -c "a,b='$3','$4'; print(f'{float(b)/float(a):.2f}x' if a and b else '-')" 2>/dev/null)
  rows+=("| ${1^^} $2 | $3 | $4 | $r |")
  echo "| ${1^^} $2 | $3 | $4 | $r |" >> "$out/issue15-rows.md"  # kept if the call times out
}
for q in $extra; do
  M=/tmp/i15-$q.gguf
  lc=$(python3 .peer/llamacpp_bench.py $M 512 128 3 2>/dev/null | tee -a "$log" | grep RESULT)
  lc_pp=$(echo "$lc" | sed -n 's/.*pp512: \([0-9.]*\) tok\/s.*/\1/p')
  lc_tg=$(echo "$lc" | sed -n 's/.*tg128: \([0-9.]*\) tok\/s.*/\1/p')
  r=$($S bench --model $M --device cuda --prompt 512 --gen 128 --reps 3 --json 2>>"$log"); echo "$r" >> "$log"
  row $q "pp512 (tok/s)" "$lc_pp" "$(echo "$r" | js prompt_tok_s)"
  row $q "tg128 (tok/s)" "$lc_tg" "$(echo "$r" | js decode_tok_s)"
  for n in 8 32 64; do
    lc=$(python3 .peer/llamacpp_batched.py $M $n 128 128 2>/dev/null | tee -a "$log" | grep RESULT | sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p')
    r=$($S bench --model $M --device cuda --prompt 128 --gen 128 --reps 1 --batch $n --json 2>>"$log"); echo "$r" >> "$log"
    row $q "$n sequences, aggregate decode (tok/s)" "$lc" "$(echo "$r" | js batch_decode_tok_s)"
  done
  rm -f $M
  echo "$q done at $SECONDS s" | tee -a "$log"
done
echo "done at $SECONDS s" | tee -a "$log"
echo
echo "== peer.sh (Q4_K)"
sed -n '/^== table/,$p' /tmp/i15-peer.out
echo
echo "| work | llama.cpp | smelt | ratio |"
echo "|---|---:|---:|---:|"
printf '%s\n' "${rows[@]}" | tee -a "$log"
