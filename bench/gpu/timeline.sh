#!/usr/bin/env bash
# Where a single-stream decode step goes now (issues 15 and 16), and the rows issue 15's
# table still lacked (a Q8_0 file), in one device call on one GPU:
#  1. llama.cpp built here from .peer in the background (`gpu-llamacpp.sh`: its random
#     Llama-3-8B-shape Q8_0 file, pp512 and tg128);
#  2. SMELT_CUDA_TIMELINE=1 single-stream decode (512-token prompt, 64 steps; graph replays,
#     per-kernel run time) of `smelt synth` qwen3-30b-a3b Q4_K and llama3-8b Q4_K, and the
#     plain tg128 of each without the timeline;
#  3. the Q8_0 rows: pp512, tg128, aggregate decode of 8/32/64 sequences, llama.cpp and
#     smelt on llama.cpp's Q8_0 file;
#  4. llama.cpp's pp512 / tg128 on the 30B file (the ratio beside the timeline);
#  5. the built llama-cpp-python packed into $OUT/llsite.tgz when it is small enough to
#     carry into later calls instead of building it again.
#
# Here:  ../shared/peer/prepare.sh .peer (slimmed, see RESULTS); mkdir -p .gpu-tl;
#        strip + gzip -9 the release smelt into .gpu-tl/smelt.gz
# There: timeout 590 bash bench/gpu/timeline.sh    carry [".gpu-tl", ".peer"]
# Log: $OUT/timeline.log (or bench/out); the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/timeline.log"
S=/tmp/smelt-tl
gunzip -c .gpu-tl/smelt.gz > $S && chmod +x $S
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; } | tee "$log"
(bash .peer/gpu-llamacpp.sh .peer llama3-8b Q8_0 > /tmp/tl-ll.log 2>&1; echo "llama.cpp rc=$? at $SECONDS s" >> /tmp/tl-ll.log) &
llpid=$!
export PYTHONPATH=/tmp/site
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
rows=()
row() { # name llama smelt
  local r
  r=$(python3 -c "a,b='$2','$3'; print(f'{float(b)/float(a):.2f}x' if a and b else '-')" 2>/dev/null)
  rows+=("| $1 | $2 | $3 | $r |")
}
M30=/tmp/tl-30b.gguf; M8=/tmp/tl-8b.gguf
$S synth --shape qwen3-30b-a3b --quant q4_k -o $M30 2>&1 | tail -1 | tee -a "$log"
$S synth --shape llama3-8b --quant q4_k -o $M8 2>&1 | tail -1 | tee -a "$log"
echo "synth done at $SECONDS s" | tee -a "$log"
for m in $M30 $M8; do
  r=$($S bench --model $m --device cuda --prompt 512 --gen 128 --reps 2 --json 2>>"$log"); echo "$r" >> "$log"
  echo "tg128 $(basename $m): $(echo "$r" | js decode_tok_s) tok/s" | tee -a "$log"
  echo "== timeline $(basename $m)" | tee -a "$log"
  SMELT_CUDA_TIMELINE=1 $S bench --model $m --device cuda --prompt 512 --gen 64 --reps 1 > /tmp/tl.out 2>&1
  cp /tmp/tl.out "$out/timeline-$(basename $m .gguf).txt"
  cat /tmp/tl.out >> "$log"
done
echo "timelines done at $SECONDS s" | tee -a "$log"
wait $llpid
cat /tmp/tl-ll.log >> "$log"
Q=/tmp/peer-llama3-8b-Q8_0.gguf
lc=$(grep RESULT /tmp/tl-ll.log | tail -1)
if [ -s $Q ] && [ -n "$lc" ]; then
  r=$($S bench --model $Q --device cuda --prompt 512 --gen 128 --reps 3 --json 2>>"$log"); echo "$r" >> "$log"
  row "Q8_0 pp512" "$(echo "$lc" | sed -n 's/.*pp512: \([0-9.]*\) tok\/s.*/\1/p')" "$(echo "$r" | js prompt_tok_s)"
  row "Q8_0 tg128" "$(echo "$lc" | sed -n 's/.*tg128: \([0-9.]*\) tok\/s.*/\1/p')" "$(echo "$r" | js decode_tok_s)"
  for n in 8 32 64; do
    l=$(python3 .peer/llamacpp_batched.py $Q $n 128 128 2>/dev/null | tee -a "$log" | grep RESULT | sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p')
    r=$($S bench --model $Q --device cuda --prompt 128 --gen 128 --reps 1 --batch $n --json 2>>"$log"); echo "$r" >> "$log"
    row "Q8_0 $n sequences, aggregate decode" "$l" "$(echo "$r" | js batch_decode_tok_s)"
  done
  echo "Q8_0 rows done at $SECONDS s" | tee -a "$log"
  rm -f $Q
  l=$(python3 .peer/llamacpp_bench.py $M30 512 128 3 2>/dev/null | tee -a "$log" | grep RESULT)
  r=$(grep '"decode_tok_s"' "$log" | head -1)
  row "qwen3-30b-a3b Q4_K tg128" "$(echo "$l" | sed -n 's/.*tg128: \([0-9.]*\) tok\/s.*/\1/p')" "$(echo "$r" | js decode_tok_s)"
  row "qwen3-30b-a3b Q4_K pp512" "$(echo "$l" | sed -n 's/.*pp512: \([0-9.]*\) tok\/s.*/\1/p')" "$(echo "$r" | js prompt_tok_s)"
  (cd /tmp/site && tar czf "$out/llsite.tgz" llama_cpp 2>/dev/null; ls -la "$out/llsite.tgz")
  sz=$(stat -c %s "$out/llsite.tgz" 2>/dev/null || echo 0)
  [ "$sz" -gt 45000000 ] && { echo "llsite.tgz $sz bytes: too large to carry"; rm -f "$out/llsite.tgz"; }
else
  echo "llama.cpp failed: see the log" | tee -a "$log"
  tail -20 /tmp/tl-ll.log
fi
echo "done at $SECONDS s" | tee -a "$log"
for m in tl-30b tl-8b; do
  echo "== timeline $m (top)"; grep -A28 -i "timeline" "$out/timeline-$m.txt" | head -34
done
echo
echo "| work | llama.cpp | smelt | ratio |"
echo "|---|---:|---:|---:|"
printf '%s\n' "${rows[@]}" | tee -a "$log"
