#!/usr/bin/env bash
# The session's last device call (2026-11-28): the explicit one-row rope + KV append
# (`Backend::rope_kv_write` at one row: the Q|K|V GEMV's epilogue when the deferred GEMV
# is that row's group, else one `rope_kv_rows` launch; no more rope deferred and joined by
# address) checked, then issue 15's table (`bench/gpu/issue15.sh`) with this tree:
#  1. in the background while peer.sh builds llama.cpp (none starts after 120 s, so all end before its timed
#     rows): `cuda_parity check` of this tree on tiny llama3, qwen2 (biases), qwen3 (neox,
#     head norms), qwen35 (gated Q, delta-net); and the greedy-token digests of one
#     sequence (`smelt bench --batch 1`) from the tree before (.gpu-load's smelt) and this
#     one on each, which must be equal (same kernels, same arguments);
#  2. issue15.sh: Q4_K via peer.sh (pp512, tg128, pp4096, 8/32/64 sequences), then the
#     Q4_K_M and Q8_0 rows, llama.cpp built in the same call.
# Here:  ../shared/peer/prepare.sh .peer; the release smelt (this tree) stripped + gzip -9
#        into .gpu-peer/smelt.gz and its cuda_parity into .gpu-dn/cuda_parity.gz;
#        .gpu-load/smelt.xz the tree before (bash bench/gpu/load.sh pack at 79e8fc0)
# There: timeout 590 bash bench/gpu/final15.sh  carry [".gpu-peer", ".gpu-dn", ".gpu-load", ".peer"]
# Log: $OUT/final15-checks.md, $OUT/issue15.log, $OUT/peer.log; the tables last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}; mkdir -p "$out"
B=/tmp/f15; mkdir -p $B
gunzip -c .gpu-peer/smelt.gz > $B/smelt && chmod +x $B/smelt
gunzip -c .gpu-dn/cuda_parity.gz > $B/cuda_parity && chmod +x $B/cuda_parity
xz -dc .gpu-load/smelt.xz > $B/smelt-old && chmod +x $B/smelt-old
checks=$out/final15-checks.md
SECONDS=0
(
  echo "| tiny model | cuda_parity (this tree) | greedy digests --batch 1, before / this tree |"
  echo "|---|---|---|"
  for m in llama3-tiny:q4_k qwen2-tiny:q8_0 qwen3-tiny:q4_k qwen35-tiny:q4_k; do
    [ $SECONDS -lt 120 ] || { echo "| (no time left for $m) | | |"; continue; }
    s=${m%%:*}; q=${m##*:}; f=/tmp/f15-$s.gguf
    $B/smelt synth --shape $s --quant $q -o $f > /dev/null 2>&1
    timeout 100 $B/cuda_parity check $f > /tmp/f15-p.out 2>&1
    cat /tmp/f15-p.out >> $out/final15-parity.log
    p=$(grep -E '^parity:' /tmp/f15-p.out | cut -d' ' -f2)
    cells=()
    for b in 1; do
      d=()
      for bin in smelt-old smelt; do
        o=$(timeout 60 $B/$bin bench --model $f --device cuda --prompt 40 --gen 32 --reps 1 --batch $b --json 2>/dev/null)
        g=$(echo "$o" | grep -o '"seq_token_digests":\[[^]]*\]')
        if [ -n "$g" ]; then d+=("$(echo "$g" | md5sum | cut -c1-8)"); else d+=("none"); fi
      done
      if [ "${d[0]}" = "${d[1]}" ] && [ "${d[0]}" != none ]; then cells+=("${d[0]} = ${d[1]} SAME"); else cells+=("${d[0]} / ${d[1]} DIFFER"); fi
    done
    echo "| $s $q | ${p:-none} | ${cells[0]} |"
  done
  echo "checks done at $SECONDS s"
) > $checks 2>&1 &
ckpid=$!
timeout 585 bash bench/gpu/issue15.sh
wait $ckpid 2>/dev/null
echo
echo "== checks (none starts after 120 s: llama.cpp's build and its own timings end later)"
cat $checks
