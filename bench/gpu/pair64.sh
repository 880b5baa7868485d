#!/usr/bin/env bash
# Narrow GEMM layouts against the default (`gemm::narrow::Layout`): the two-tile ring
# (`Rows16Pair`, 16p: 64-token blocks with a three-tile ring take 166 KB, one block (8 warps)
# an SM; with two tiles 111 KB, two blocks (16 warps)). Its second run (2026-11-27 21:25 UTC)
# also had half tiles (32h: warps of 32 rows over half of each tile's K, half the
# activation reads an `mma`), no faster and since removed (bench/gpu/NOTES.md). One device
# call: the narrow kernels against their twins and their launch times per layout
# (`gpu_ops -o gemm_f16`, `gpu_ops perf -o gemm_f16`), whole-model parity on the layouts,
# interleaved rounds of `smelt bench --batch N` with SMELT_CUDA_GEMM_NARROW_ROWS unset and
# each of VARIANTS on the Llama-3-8B-shape Q4_K (and Q8_0 at Q8_BATCHES), then Nsight
# Compute on one layer's 64-token narrow launches of each layout (stall reasons).
# Here:  bash bench/gpu/hybrid.sh pack    There: bash bench/gpu/pair64.sh    carry [".gpu-dn"]
# Environment: ROUNDS (default 3), BATCHES (default "16 32 40 64"), Q8_BATCHES (default
# "32 64"), VARIANTS (default "16p"), NCU (default 1).
# Log: $OUT/pair64.log; table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}; mkdir -p "$out"; log="$out/pair64.log"; table=/tmp/p64-table.md
B=/tmp/p64-bin; mkdir -p $B
for b in smelt cuda_parity gpu_ops; do gunzip -c .gpu-dn/$b.gz > $B/$b && chmod +x $B/$b; done
SECONDS=0
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
echo "| check | result |" > $table; echo "|---|---|" >> $table
timeout 200 $B/gpu_ops -o gemm_f16 > /tmp/p64-ops.out 2>&1; rc=$?
cat /tmp/p64-ops.out >> "$log"
echo "| gpu_ops -o gemm_f16 (rc $rc) | $(grep -cE ' FAIL$' /tmp/p64-ops.out) FAIL lines; $(grep -c '_r16p_' /tmp/p64-ops.out) r16p, $(grep -c '_h_' /tmp/p64-ops.out) h lines |" >> $table
timeout 240 $B/gpu_ops perf -o gemm_f16 > /tmp/p64-perf.out 2>&1; echo "perf rc $? at $SECONDS s" | tee -a "$log"
cat /tmp/p64-perf.out >> "$log"
for m in qwen3-tiny:q4_k llama3-tiny:q8_0; do
  s=${m%%:*}; q=${m##*:}; f=/tmp/p64-$s-$q.gguf
  $B/smelt synth --shape $s --quant $q -o $f > /dev/null 2>&1
  for v in ${VARIANTS:-16p}; do
    SMELT_CUDA_GEMM_NARROW_ROWS=$v timeout 120 $B/cuda_parity check $f > /tmp/p64-p.out 2>&1
    cat /tmp/p64-p.out >> "$log"
    echo "| cuda_parity $s $q, ROWS=$v | $(grep -E '^parity:' /tmp/p64-p.out | cut -d' ' -f2) $(grep 'batched max' /tmp/p64-p.out | grep -o 'max cuda [0-9.]* cpu [0-9.]* ([0-9.]*x)' | head -1) |" >> $table
  done
done
echo "parity done at $SECONDS s" | tee -a "$log"
js() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
med() { sort -n "$1" | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
for q in q4_k q8_0; do
f=/tmp/p64-8b-$q.gguf
$B/smelt synth --shape llama3-8b --quant $q -o $f > /dev/null 2>&1
if [ $q = q4_k ]; then batches=${BATCHES:-16 32 40 64}; else batches=${Q8_BATCHES:-32 64}; fi
for n in $batches; do
  vs="def ${VARIANTS:-16p}"
  for v in $vs; do : > /tmp/p64-$q-$n-$v.txt; done
  for r in $(seq ${ROUNDS:-3}); do
    for v in $vs; do
      if [ $v = def ]; then e=SMELT_CUDA_GEMM_NARROW_ROWS=; else e=SMELT_CUDA_GEMM_NARROW_ROWS=$v; fi
      o=$(env $e timeout 120 $B/smelt bench --model $f --device cuda --prompt 128 --gen 64 --reps 1 --batch $n --json 2>>"$log")
      echo "$q n=$n $v round $r: $o" >> "$log"
      x=$(echo "$o" | js batch_decode_tok_s); d=$(echo "$o" | grep -o '"seq_token_digests":\[[^]]*\]' | md5sum | cut -c1-8)
      echo "$x $d" >> /tmp/p64-$q-$n-$v.txt
    done
  done
  a=$(med /tmp/p64-$q-$n-def.txt); row="| 8B $q --batch $n: default $a"
  for v in ${VARIANTS:-16p}; do
    b=$(med /tmp/p64-$q-$n-$v.txt); row="$row, $v $b ($(python3 -c "print(f'{$b/$a:.3f}x')" 2>/dev/null))"
  done
  echo "$row; digests $(cut -d' ' -f2 /tmp/p64-$q-$n-*.txt | sort | uniq -c | tr '\n' ' ') |" >> $table
done
[ $q = q4_k ] || rm -f $f
done
f=/tmp/p64-8b-q4_k.gguf
echo "bench done at $SECONDS s" | tee -a "$log"
if [ "${NCU:-1}" = 1 ]; then
  NCUB=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  echo "ncu: $NCUB" | tee -a "$log"
  : > /tmp/p64-stalls.txt
  { echo "| layout | kernel | grid | regs | dur us | DRAM % | mem % | SM % | occupancy % | top stalls |"; echo "|---|---|---|---|---|---|---|---|---|---|"; } > /tmp/p64-ncu.md
  for v in 16 ${VARIANTS:-16p}; do
    SMELT_CUDA_GEMM_NARROW_ROWS=$v SMELT_CUDA_GRAPHS=0 timeout 200 $NCUB --clock-control none \
      --kernel-name "regex:^gemm_narrow64_(r16p?|h)_q4_k$" --launch-skip 300 --launch-count 7 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      $B/smelt bench --model $f --device cuda --prompt 8 --gen 16 --reps 1 --batch 64 > "$out/ncu-$v.txt" 2>&1
    echo "ncu $v rc $? at $SECONDS s" | tee -a "$log"
    python3 bench/gpu/ncu_table.py "$out/ncu-$v.txt" "$v" >> /tmp/p64-ncu.md 2>>"$log" || true
    grep -E "Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Achieved Occupancy|Block Limit|Executed Ipc|Pipe" "$out/ncu-$v.txt" | head -40 >> "$log"
    # Stall reasons (cycles a warp waits per issued instruction) of the second launch, largest first.
    echo "stalls $v: $(awk '/gemm_narrow64/{n++} n==2 && /issue_stalled/ {sub(/smsp__average_warps_issue_stalled_/,"",$1); sub(/_per_issue_active.ratio/,"",$1); print $NF, $1}' "$out/ncu-$v.txt" | sort -rn | head -6 | tr '\n' ';')" >> /tmp/p64-stalls.txt
  done
  cat /tmp/p64-ncu.md /tmp/p64-stalls.txt >> $table 2>/dev/null
fi
echo "done at $SECONDS s" | tee -a "$log"
cat $table | tee -a "$log"
