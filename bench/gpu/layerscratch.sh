#!/usr/bin/env bash
# Layers reuse scratch (`arena::StepScratch`): the Qwen3-Next-80B-A3B at 32 sequences, which
# ran out of GPU memory with 512-token prompt chunks (bench/RESULTS.md 2026-11-27 17:00 UTC),
# beside llama.cpp built in the same call; whole-model parity of the tiny models with the
# layer arenas on; the same logits' digest with them on and off; and the qwen3next-tiny
# Q8_0 parity bisect (bench/gpu/q8narrow.sh's settings).
#
# Here:  bash bench/gpu/hybrid.sh pack     (.gpu-dn: smelt, cuda_parity, gpu_ops; .peer)
# There: timeout 590 bash bench/gpu/layerscratch.sh    carry [".gpu-dn", ".peer"]
# Log: $OUT/layerscratch.log (or bench/out); the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/layerscratch.log"
table=/tmp/ls-table.md
B=/tmp/ls-bin; mkdir -p $B
for b in smelt cuda_parity; do gunzip -c .gpu-dn/$b.gz > $B/$b && chmod +x $B/$b; done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; } | tee "$log"
(bash .peer/gpu-llamacpp.sh .peer llama3-1b Q4_K > /tmp/ls-ll.log 2>&1; echo "llama.cpp build rc=$? at $SECONDS s" >> /tmp/ls-ll.log) &
llpid=$!
M80=/dev/shm/ls-80b.gguf
($B/smelt synth --shape qwen3-next-80b-a3b --quant q4_k -o $M80 > /tmp/ls-synth.log 2>&1; echo "synth rc=$? at $SECONDS s" >> /tmp/ls-synth.log) &
synpid=$!
echo "| check | result |" > $table
echo "|---|---|" >> $table

# 1. Whole-model parity with the layer arenas on (the default).
for m in qwen3-tiny:q4_k qwen3moe-tiny:q4_k qwen3moe-tiny:q8_0 qwen35-tiny:q8_0 qwen35moe-tiny:q4_k qwen3next-tiny:q4_k mixtral-tiny:q4_k llama3-tiny:q4_k; do
  s=${m%%:*}; q=${m##*:}; f=/tmp/ls-$s-$q.gguf
  $B/smelt synth --shape $s --quant $q -o $f > /dev/null 2>&1 || { echo "| synth $s $q | no such shape |" >> $table; continue; }
  timeout 120 $B/cuda_parity check $f > /tmp/ls-p.out 2>&1
  cat /tmp/ls-p.out >> "$log"
  echo "| cuda_parity $s $q | $(grep -E '^parity:' /tmp/ls-p.out | cut -d' ' -f2) |" >> $table
done

# 2. The same bits with the layer arenas on and off (SMELT_CUDA_DIGEST: every logits copy).
f=/tmp/ls-qwen3next-tiny-q4_k.gguf
for ls in 1 0; do
  d=$(SMELT_CUDA_LAYER_SCRATCH=$ls SMELT_CUDA_DIGEST=1 $B/smelt bench --model $f --device cuda --prompt 300 --gen 16 --reps 1 --batch 4 --ubatch 128 2>&1 | grep -i digest | tail -1)
  echo "digest LAYER_SCRATCH=$ls: $d" | tee -a "$log"
  echo "| digest qwen3next-tiny, 4 x 300-token prompts in 128-token steps, LAYER_SCRATCH=$ls | $d |" >> $table
done

# 3. qwen3next-tiny Q8_0: which narrow-GEMM setting moves the batched test.
f=/tmp/q3n-q8.gguf
$B/smelt synth --shape qwen3next-tiny --quant q8_0 -o $f > /dev/null 2>&1
for e in NONE=1 SMELT_CUDA_GEMM_NARROW_MAX=0 SMELT_CUDA_GEMM_NARROW_MAX=16 SMELT_CUDA_GEMM_NARROW_MAX=32 SMELT_CUDA_GEMM_NARROW_SPLITS=1 SMELT_CUDA_GEMM_NARROW_ROWS=16 SMELT_CUDA_GEMM_NARROW_ROWS=32; do
  env $e timeout 120 $B/cuda_parity check $f > /tmp/ls-p.out 2>&1
  echo "== q8 $e" >> "$log"; grep -E "batched|^parity" /tmp/ls-p.out >> "$log"
  echo "| qwen3next-tiny q8_0 $e | $(grep -E '^parity:' /tmp/ls-p.out | cut -d' ' -f2) $(grep 'batched max' /tmp/ls-p.out | grep -o 'max cuda [0-9.]* cpu [0-9.]* ([0-9.]*x)' | head -1) |" >> $table
done
echo "parity done at $SECONDS s" | tee -a "$log"

# 4. The 80B at 32 sequences (and 8, layer arenas off, for the memory they took before).
wait $synpid; cat /tmp/ls-synth.log >> "$log"
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
run80() {  # label, env, args
  (while sleep 1; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done) > /tmp/ls-mem.txt 2>/dev/null &
  local mp=$!
  env $2 timeout 200 $B/smelt bench --model $M80 --device cuda $3 --json > /tmp/ls-o.out 2> /tmp/ls-o.err
  local rc=$?
  kill $mp 2>/dev/null
  local peak; peak=$(sort -n /tmp/ls-mem.txt | tail -1)
  local v; v=$(js batch_decode_tok_s < /tmp/ls-o.out); [ -n "$v" ] || v=$(js decode_tok_s < /tmp/ls-o.out)
  cat /tmp/ls-o.out >> "$log"; grep -v '^\s*$' /tmp/ls-o.err | tail -6 >> "$log"
  echo "| 80B $1 | rc $rc, $v tok/s, peak $peak MiB |" >> $table
  echo "$v"
}
s80=$(run80 "32 seqs" NONE=1 "--prompt 128 --gen 128 --reps 1 --batch 32")
run80 "8 seqs, LAYER_SCRATCH=0" SMELT_CUDA_LAYER_SCRATCH=0 "--prompt 128 --gen 32 --reps 1 --batch 8" > /dev/null
run80 "8 seqs" NONE=1 "--prompt 128 --gen 32 --reps 1 --batch 8" > /dev/null
run80 "pp512/tg128" NONE=1 "--prompt 512 --gen 128 --reps 1" > /dev/null
echo "smelt done at $SECONDS s" | tee -a "$log"
wait $llpid; cat /tmp/ls-ll.log >> "$log"
export PYTHONPATH=/tmp/site
l80=$(python3 .peer/llamacpp_batched.py $M80 32 128 128 2>/dev/null | tee -a "$log" | grep RESULT | sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p')
rm -f $M80
echo "done at $SECONDS s" | tee -a "$log"
python3 -c "a,b='$l80','$s80'; print(f'| 80B 32 sequences aggregate decode: llama.cpp {a}, smelt {b} | ' + (f'{float(b)/float(a):.2f}x |' if a and b else '- |'))" >> $table
cat $table | tee -a "$log"
