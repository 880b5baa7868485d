#!/usr/bin/env bash
# The narrow GEMM for Q6_K (Q4_K_M's attn_v, ffn_down and output head) and the split
# GEMMs' own fix-up (no reduce launch) against the commit before both (issue 15), one
# device call on one GPU:
#  1. gpu_ops -o gemm,gemm_f16: every GEMM against its CPU twin, every narrow kernel (Q4_K
#     and Q6_K, both layouts, 8/16/32 tokens a block, ragged shapes), each split case both
#     ways (fix-up and reduce launch) compared bit for bit, counters back at zero;
#  2. gpu_ops perf -o gemm_f16: microseconds a launch, Q6_K narrow vs int8;
#  3. Llama-3-8B shape (smelt synth) in Q4_K (its head is Q6_K) and Q4_K_M, whole decode
#     steps (128-token prompts, 64 steps) of 8, 16, 32 and 64 sequences, the base smelt
#     and the new one interleaved, ROUNDS rounds (default 2); on Q4_K also the new one with
#     SMELT_CUDA_SPLIT_FIXUP=0 at 16-64 (greedy digests must equal the fix-up's);
#  4. a 32-sequence Q4_K step's timeline (SMELT_CUDA_TIMELINE=1), new.
#
# Here:  cargo build --release -p smelt --bin smelt -p smelt-kernels --example gpu_ops, then
#        strip + gzip into the git-ignored .gpu-q/ (smelt.gz, gpu_ops.gz; smelt-base.gz
#        from the commit before)
# There: timeout 590 bash bench/gpu/narrow_q6k.sh    carry [".gpu-q"]
# Log: $OUT/narrow_q6k.log (or bench/out); the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/narrow_q6k.log"
B=/tmp/q6k-bin
mkdir -p $B
for b in smelt gpu_ops smelt-base; do
  gunzip -c .gpu-q/$b.gz > $B/$b && chmod +x $B/$b
done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
($B/smelt synth --shape llama3-8b --quant q4_k -o /tmp/q6k-q4_k.gguf > /tmp/q6k-synth1.log 2>&1;
 $B/smelt synth --shape llama3-8b --quant q4_k_m -o /tmp/q6k-q4_k_m.gguf > /tmp/q6k-synth2.log 2>&1) &
synpid=$!
table=()

echo "== 1. gpu_ops -o gemm,gemm_f16" | tee -a "$log"
timeout 200 $B/gpu_ops -o gemm,gemm_f16 > /tmp/q6k-ops.out 2>&1 && r=PASS || r=FAIL
cat /tmp/q6k-ops.out >> "$log"
table+=("| gpu_ops -o gemm,gemm_f16 (fix-up both ways; narrow Q4_K and Q6_K vs the twin) | $r, $(grep -c 'narrow.*q6_k' /tmp/q6k-ops.out) Q6_K narrow lines, $(grep -c 'fix-up' /tmp/q6k-ops.out) fix-up lines, $(grep -c FAIL /tmp/q6k-ops.out) FAIL |")
echo "== 2. gpu_ops perf -o gemm_f16" | tee -a "$log"
timeout 200 $B/gpu_ops perf -o gemm_f16 > /tmp/q6k-perf.out 2>&1
cat /tmp/q6k-perf.out >> "$log"
wait $synpid
cat /tmp/q6k-synth1.log /tmp/q6k-synth2.log >> "$log"

echo "== 3. batched decode, base vs new" | tee -a "$log"
declare -A res dig
for round in $(seq 1 "${ROUNDS:-2}"); do
  for q in q4_k q4_k_m; do
    for bt in 8 16 32 64; do
      for v in base new off; do
        [ $v = off ] && { [ $q = q4_k ] && [ $bt != 8 ] || continue; }
        bin=$B/smelt
        env_=()
        [ $v = base ] && bin=$B/smelt-base
        [ $v = off ] && env_=(SMELT_CUDA_SPLIT_FIXUP=0)
        j=$(env "${env_[@]}" $bin bench --model /tmp/q6k-$q.gguf --device cuda --prompt 128 --gen 64 --reps 1 --batch $bt --json 2>>"$log" | tr -d '\n')
        echo "round $round $q batch $bt $v: $j" >> "$log"
        t=$(echo "$j" | grep -o '"decode_tok_s":[0-9.]*' | cut -d: -f2)
        d=$(echo "$j" | grep -o '"seq_token_digests":\[[^]]*\]' | md5sum | cut -c1-8)
        echo "round $round $q batch $bt $v: $t tok/s, digests $d" | tee -a "$log"
        res[$q-$bt-$v]="${res[$q-$bt-$v]:-} ${t%.*}"
        dig[$q-$bt-$v]="${dig[$q-$bt-$v]:-} $d"
      done
    done
  done
done
for q in q4_k q4_k_m; do
  for bt in 8 16 32 64; do
    table+=("| llama3-8b $q, $bt sequences: base / new / new without fix-up, aggregate decode tok/s | ${res[$q-$bt-base]} / ${res[$q-$bt-new]} / ${res[$q-$bt-off]:- -} (digests new ${dig[$q-$bt-new]}, off ${dig[$q-$bt-off]:- -}) |")
  done
done
echo "== 4. timeline, 32 sequences, q4_k, new" | tee -a "$log"
SMELT_CUDA_TIMELINE=1 $B/smelt bench --model /tmp/q6k-q4_k.gguf --device cuda --prompt 128 --gen 64 --reps 1 --batch 32 > /tmp/q6k-tl.out 2>&1
cat /tmp/q6k-tl.out >> "$log"
echo "done at $SECONDS s" | tee -a "$log"
echo
echo "== perf (Q6_K narrow)"; grep "^| Q6_K" /tmp/q6k-perf.out | head -16
echo "== timeline"; grep -A16 "CUDA timeline" /tmp/q6k-tl.out
echo
echo "| check | result |"
echo "|---|---|"
printf '%s\n' "${table[@]}"
