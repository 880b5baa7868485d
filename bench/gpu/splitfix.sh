#!/usr/bin/env bash
# Branch `splitfix` on one GPU, in one device call: split-K GEMMs whose last block of each
# output tile sums the splits (`gemm::fixup`) instead of a `gemm_reduce` launch after them
# (a 32-sequence Llama-3-8B-shape Q4_K step on an H100 spent ~1.25 ms of 9.6 in 64 reduce
# launches). Checks and timings:
#  1. gpu_ops -o gemm,gemm_f16: every GEMM (int8, f16, narrow, batch-wide) against its CPU
#     twin, each split case run both ways (fix-up, and the reduce launch as with
#     the engine's default) with the two outputs compared bit for bit ("gemm split
#     fix-up" lines), and the counters checked back at zero after all of them;
#  2. Llama-3-8B-shape Q4_K (smelt synth), --batch 16, 32, 64 (128-token prompts, 64 steps):
#     the branch with SMELT_CUDA_SPLIT_FIXUP=1 (on; off by default since it measured slower), the branch as is (off) and
#     main's binary (main: the same reduce path, to show the kernels' new epilogue costs the
#     off path nothing), interleaved, ROUNDS rounds (default 2); greedy token digests must be
#     equal across all three;
#  3. one 32-sequence step's timeline (SMELT_CUDA_TIMELINE=1) with the fix-up on: no
#     gemm_reduce rows, the GEMMs' own run times.
#
# Here:  the branch's smelt and gpu_ops (cargo build --release -p smelt --bin smelt;
#        cargo build --release -p smelt-kernels --example gpu_ops) and main's smelt, strip,
#        gzip into the git-ignored .gpu-splitfix/ as smelt.gz, gpu_ops.gz, smelt-main.gz
#        (the exact commands: /work/notes/ready-splitfix.md).
# There: timeout 590 bash bench/gpu/splitfix.sh    carry [".gpu-splitfix"]
# Log: $OUT/splitfix.log (or bench/out); the table last. PASS: gpu_ops PASS with 0 FAIL
# lines, and "digests equal: yes" for every batch.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/splitfix.log"
B=/tmp/sf-bin
mkdir -p $B
for b in smelt smelt-main gpu_ops; do
  gunzip -c .gpu-splitfix/$b.gz > $B/$b && chmod +x $B/$b
done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
M8=/tmp/sf-8b.gguf
($B/smelt synth --shape llama3-8b --quant q4_k -o $M8 > /tmp/sf-synth.log 2>&1) &
synpid=$!
table=()

echo "== 1. gpu_ops -o gemm,gemm_f16" | tee -a "$log"
timeout 240 $B/gpu_ops -o gemm,gemm_f16 > /tmp/sf-ops.out 2>&1 && r=PASS || r=FAIL
cat /tmp/sf-ops.out >> "$log"
nfix=$(grep -c "gemm split fix-up" /tmp/sf-ops.out)
nfail=$(grep -c "FAIL" /tmp/sf-ops.out)
table+=("| gpu_ops -o gemm,gemm_f16 (twins; fix-up vs reduce bit for bit) | $r: $nfix fix-up lines, $nfail FAIL lines |")
grep "FAIL" /tmp/sf-ops.out | head -8 | sed 's/^/    /' | tee -a "$log"
echo "gpu_ops done at $SECONDS s" | tee -a "$log"
wait $synpid
cat /tmp/sf-synth.log >> "$log"

echo "== 2. batched decode: fix-up on / off / main" | tee -a "$log"
declare -A res dig
arms="on off main"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for bt in 16 32 64; do
    for arm in $arms; do
      bin=smelt; env_=()
      [ $arm = on ] && env_=(SMELT_CUDA_SPLIT_FIXUP=1)
      [ $arm = main ] && bin=smelt-main
      j=$(env "${env_[@]}" $B/$bin bench --model $M8 --device cuda --prompt 128 --gen 64 --reps 1 --batch $bt --json 2>>"$log" | tr -d '\n')
      echo "round $round batch $bt $arm: $j" >> "$log"
      v=$(echo "$j" | grep -o '"decode_tok_s":[0-9.]*' | cut -d: -f2)
      ms=$(echo "$j" | grep -o '"decode_ms_per_token":[0-9.]*' | cut -d: -f2)
      d=$(echo "$j" | grep -o '"seq_token_digests":\[[^]]*\]' | md5sum | cut -c1-8)
      echo "round $round batch $bt $arm: $v tok/s, $ms ms/step, digests $d (at $SECONDS s)" | tee -a "$log"
      res[$bt-$arm]="${res[$bt-$arm]:-} ${v%.*}"
      dig[$bt-$arm]="${dig[$bt-$arm]:-} $d"
    done
  done
done
for bt in 16 32 64; do
  all=$(for arm in $arms; do echo ${dig[$bt-$arm]}; done | tr ' ' '\n' | grep -v '^$' | sort -u)
  n=$(echo "$all" | wc -l)
  same=no; [ "$n" = 1 ] && [ "$all" != "d41d8cd9" ] && same=yes
  for arm in $arms; do
    table+=("| llama3-8b Q4_K --batch $bt, $arm: decode tok/s by round | ${res[$bt-$arm]} |")
  done
  table+=("| llama3-8b Q4_K --batch $bt: greedy digests equal (on, off, main, every round) | $same (${dig[$bt-on]}) |")
done

echo "== 3. timeline, 32 sequences, fix-up on" | tee -a "$log"
SMELT_CUDA_SPLIT_FIXUP=1 SMELT_CUDA_TIMELINE=1 $B/smelt bench --model $M8 --device cuda --prompt 128 --gen 64 --reps 1 --batch 32 > /tmp/sf-tl.out 2>&1
cat /tmp/sf-tl.out >> "$log"
echo "done at $SECONDS s" | tee -a "$log"
echo
echo "== gemm split fix-up lines (first 12)"; grep "gemm split fix-up" /tmp/sf-ops.out | head -12
echo "== timeline (batch 32, fix-up on)"; grep -A16 "CUDA timeline" /tmp/sf-tl.out
echo
echo "| check | result |"
echo "|---|---|"
printf '%s\n' "${table[@]}"
