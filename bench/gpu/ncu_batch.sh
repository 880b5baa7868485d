#!/usr/bin/env bash
# Why batched decode's GEMMs run at a fifth of the copy rate: Nsight Compute on the GEMM
# launches of real decode steps of 32 sequences (Llama-3-8B-shape Q4_K), for each GEMM
# the engine can pick at that size (int8, f16, narrow), so the stall reasons, achieved DRAM
# bandwidth, occupancy and issue rate say which limit each kernel hits (PATHS: which of
# int8 f16 narrow small to profile, default all).
#
# Here:  bash bench/gpu/gemm.sh build (into .gpu-lead)
# There: bash bench/gpu/ncu_batch.sh   carry [".gpu-lead"]   (after gemm_f16.sh, which
#        leaves the synthetic model in /tmp; made here otherwise)
# Environment there: BATCH (default 32), SKIP (decode GEMM launches to skip before the
# profiled ones, default 600: past the 8-token prompts, one chunk), COUNT (launches profiled, default 7: one
# layer's matmuls). Log: $OUT/ncu.log (or bench/out), a short table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/ncu.log"
B=.gpu-lead
if [ ! -x /tmp/smelt-new ]; then
  if [ -f $B/smelt.gz ]; then gunzip -c $B/smelt.gz > /tmp/smelt-new; else cp $B/smelt /tmp/smelt-new; fi
  chmod +x /tmp/smelt-new
fi
m=/tmp/llama3-8b-q4_k.gguf
[ -f $m ] || /tmp/smelt-new synth --shape llama3-8b --quant q4_k -o $m > /dev/null
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
batch=${BATCH:-32}
: > "$log"
table="$out/ncu-table.md"
echo "| path | kernel | grid | regs | dur us | DRAM % | mem % | SM % | occupancy % | top stalls |" > "$table"
echo "|---|---|---|---|---|---|---|---|---|---|" >> "$table"
for path in ${PATHS:-int8 f16 narrow small}; do
  case $path in
    small) envs="SMELT_CUDA_GEMM_SMALL_MAX=64"; re="regex:^gemm_f16s(32|64)_q4_k$" ;;
    int8) envs="SMELT_CUDA_GEMM_F16_MIN=1000000000"; re="regex:^gemm_q4_k$" ;;
    f16) envs="SMELT_CUDA_GEMM_F16_MIN=16"; re="regex:^gemm_f16_q4_k$" ;;
    narrow) envs="SMELT_CUDA_GEMM_NARROW_MAX=64"; re="regex:^gemm_narrow32_q4_k$" ;;
  esac
  echo "== $path ($envs)" | tee -a "$log"
  env $envs SMELT_CUDA_GRAPHS=0 timeout 240 $NCU --clock-control none --kernel-name "$re" \
    --launch-skip ${SKIP:-600} --launch-count ${COUNT:-7} \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis \
    /tmp/smelt-new bench --model $m --device cuda --prompt 8 --gen 16 --reps 1 --batch $batch \
    > "$out/ncu-$path.txt" 2>&1
  echo "ncu exit $?" | tee -a "$log"
  python3 bench/gpu/ncu_table.py "$out/ncu-$path.txt" "$path" >> "$table"
  grep -E "Duration|DRAM Throughput|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Achieved Occupancy|Registers Per|Block Limit|stall|Stall" "$out/ncu-$path.txt" | head -60 >> "$log"
done
echo "== table" | tee -a "$log"
tee -a "$log" < "$table"
