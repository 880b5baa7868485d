#!/usr/bin/env bash
# The session's last device call (2026-11-28): the fused norms issuing all their loads at
# once (`ops::norm::add_sum_squares`) checked against their twins and bit for bit against
# the unfused norm (`gpu_ops -o norm,norm_q8`), `cuda_parity check` on five tiny
# architectures after the CUDA backend's fields were regrouped (a refactor with no GPU
# behind it), and the Llama-3-8B-shape Q4_K's batched decode at 8 and 64 sequences, the
# profiled 64-sequence step (add + norm was 8.00 us a launch at 00:40 UTC) and pp512/tg128.
# Here:  bash bench/gpu/hybrid.sh pack    There: bash bench/gpu/norm_final.sh   carry [".gpu-dn"]
# Log: $OUT/norm_final.log; the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}; mkdir -p "$out"; log="$out/norm_final.log"; table=/tmp/nf-table.md
B=/tmp/nf; mkdir -p $B
for b in smelt cuda_parity gpu_ops; do gunzip -c .gpu-dn/$b.gz > $B/$b && chmod +x $B/$b; done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
echo "| check | result |" > $table; echo "|---|---|" >> $table
timeout 100 $B/gpu_ops -o norm,norm_q8 > /tmp/nf-ops.out 2>&1; rc=$?
cat /tmp/nf-ops.out >> "$log"
echo "| gpu_ops -o norm,norm_q8 (rc $rc) | $(grep -cE ' FAIL$' /tmp/nf-ops.out) FAIL, $(grep -cE ' PASS$' /tmp/nf-ops.out) PASS |" >> $table
grep -E ' FAIL$' /tmp/nf-ops.out | head -5 | sed 's/^/    /' >> $table
for m in llama3-tiny:q8_0 qwen3-tiny:q4_k qwen3moe-tiny:q4_k qwen35-tiny:q4_k mixtral-tiny:q8_0; do
  s=${m%%:*}; q=${m##*:}; f=/tmp/nf-$s.gguf
  $B/smelt synth --shape $s --quant $q -o $f > /dev/null 2>&1
  timeout 100 $B/cuda_parity check $f > /tmp/nf-p.out 2>&1; cat /tmp/nf-p.out >> "$log"
  echo "| cuda_parity $s $q | $(grep -E '^parity:' /tmp/nf-p.out | cut -d' ' -f2) $(grep 'batched max' /tmp/nf-p.out | grep -o '([0-9.]*x)' | head -1) |" >> $table
done
echo "checks done at $SECONDS s" | tee -a "$log"
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
f=/tmp/nf-8b-q4_k.gguf
$B/smelt synth --shape llama3-8b --quant q4_k -o $f > /dev/null 2>&1
for n in 8 64; do
  o=$(timeout 150 $B/smelt bench --model $f --device cuda --prompt 128 --gen 64 --reps 1 --batch $n --json 2>>"$log")
  echo "q4_k n=$n: $o" >> "$log"
  d=$(echo "$o" | grep -o '"seq_token_digests":\[[^]]*\]' | md5sum | cut -c1-8)
  echo "| 8B Q4_K --batch $n | $(echo "$o" | js batch_decode_tok_s) tok/s, digests $d |" >> $table
done
SMELT_CUDA_PROFILE=1 timeout 120 $B/smelt bench --model $f --device cuda --prompt 8 --gen 16 --reps 1 --batch 64 > /tmp/nf-prof.out 2>&1
cat /tmp/nf-prof.out >> "$log"
grep -E "^PROFILE|add_rms_norm|glu_|gemm_reduce" /tmp/nf-prof.out | head -8 | sed 's/^/    /' >> $table
o=$(timeout 90 $B/smelt bench --model $f --device cuda --json 2>>"$log")
echo "default bench: $o" >> "$log"
echo "| 8B Q4_K smelt bench pp512 / tg128 | $(echo "$o" | js prompt_tok_s) / $(echo "$o" | js decode_tok_s) |" >> $table
echo "done at $SECONDS s" | tee -a "$log"
cat $table | tee -a "$log"
