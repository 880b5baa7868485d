#!/usr/bin/env bash
# The CUDA backend's restructuring (issue 15, "Structure": explicit matmul fusion, settings
# read once, backend/cuda/mod.rs split) against the tree before it, on the GPU machine in
# one device call. What must hold: the same bits (SMELT_CUDA_DIGEST: a hash of every logits
# copy of a prompt + 48 greedy decode steps, graphs on) and the same kernels (per-kernel
# launch counts of eager decode steps, SMELT_CUDA_PROFILE=1) on every architecture whose
# matmuls became groups, cuda_parity passing on the cut-down real models with the same
# digest before and after, and decode speed no lower.
#
# Here:  bash bench/gpu/struct15.sh build
#        (builds smelt + cuda_parity of this tree and of BASE, default `git merge-base HEAD
#        main`, gzipped into .gpu-struct15/{old,new}/, plus two cut-down real models)
# There: bash bench/gpu/struct15.sh run     carry [".gpu-struct15"]
# Environment there: SHAPES (synthetic models, "shape:quant ...", default below), ROUNDS
# (decode-speed rounds, default 3), SKIP_SPEED=1. Output under $OUT (or bench/out):
# struct15.log, the table last.
#
# Where old and new may rightly differ: old joined GEMVs only when weights happened to be
# adjacent, so on an 8B shape (weights in 256 MB chunks) some layers' Q|K|V or gate|up ran
# unfused; new fuses every layer: fewer gemv launches per step there (a launch-count
# difference in the gemv_* and rope rows only), and the bits may differ only if the Q|K|V
# GEMV's rope epilogue rounds differently from the separate rope_kv kernel. On qwen35
# (Qwen3.5) old could also join a delta-net layer's attn_gate with ssm_beta by adjacency.
# Everything else must be equal.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${GPU_DIR:-.gpu-struct15}
case "${1:-run}" in
  build)
    set -e
    T=${CARGO_TARGET_DIR:-$PWD/target}
    case "$T" in /*) ;; *) T=$PWD/$T ;; esac
    base=${BASE:-$(git merge-base HEAD main)}
    mkdir -p $B/old $B/new
    src=$(mktemp -d /tmp/struct15-base.XXXXXX)
    git archive "$base" | tar -x -C "$src"
    for v in old new; do
      dir=$PWD
      [ $v = old ] && dir=$src
      # Both trees share one target dir, and cargo judges a workspace crate fresh by its
      # files' times (paths relative to the crate): newer times make it rebuild each tree.
      find "$dir/crates" -type f -exec touch {} +
      (cd "$dir" && CARGO_TARGET_DIR=$T cargo build --release -p smelt --bin smelt \
        && CARGO_TARGET_DIR=$T cargo build --release -p smelt-engine --example cuda_parity)
      strip -o $B/$v/smelt $T/release/smelt
      strip -o $B/$v/cuda_parity $T/release/examples/cuda_parity
      gzip -f $B/$v/smelt $B/$v/cuda_parity
    done
    rm -rf "$src"
    cmp -s <(gunzip -c $B/old/smelt.gz) <(gunzip -c $B/new/smelt.gz) \
      && { echo "struct15.sh: old and new smelt are the same binary" >&2; exit 1; }
    echo "$base" > $B/old/COMMIT
    git rev-parse HEAD > $B/new/COMMIT
    gunzip -c $B/new/cuda_parity.gz > /tmp/struct15-cuda_parity && chmod +x /tmp/struct15-cuda_parity
    /tmp/struct15-cuda_parity shrink .models/SmolLM2-135M-Instruct.Q4_1.gguf $B/smollm2-4l.gguf --layers 4 --vocab 8192
    /tmp/struct15-cuda_parity shrink .models/gemma-3-270m-q4_k_m.gguf $B/gemma3-6l.gguf --layers 6 --vocab 8192 --window 24
    rm -f /tmp/struct15-cuda_parity
    du -sh $B
    ;;
  run)
    out=${OUT:-bench/out}
    mkdir -p "$out"
    log="$out/struct15.log"
    table="$out/struct15-table.md"
    : > "$table"
    { date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true;
      echo "old $(cat $B/old/COMMIT 2>/dev/null) new $(cat $B/new/COMMIT 2>/dev/null)"; } | tee "$log"
    bin=/tmp/struct15-bin
    mkdir -p $bin
    for v in old new; do
      for f in smelt cuda_parity; do
        # gzipped by the build, or xz'd by hand to fit the carry beside the models.
        if [ -f $B/$v/$f.xz ]; then xz -dc $B/$v/$f.xz; else gunzip -c $B/$v/$f.gz; fi > $bin/$v-$f
        chmod +x $bin/$v-$f
      done
    done
    models="$B/smollm2-4l.gguf $B/gemma3-6l.gguf"
    for s in ${SHAPES:-llama3-8b:q4_k llama3-8b:q4_k_m qwen2-tiny:q8_0 qwen3-tiny:q4_k_m qwen3moe-tiny:q8_0 qwen35-tiny:q8_0 qwen3next-tiny:q8_0 mixtral-tiny:q8_0}; do
      m=/tmp/struct15-${s/:/-}.gguf
      [ -s $m ] || $bin/new-smelt synth --shape ${s%%:*} --quant ${s##*:} -o $m >> "$log" 2>&1 \
        || { echo "synth $s FAILED" | tee -a "$log"; continue; }
      models="$models $m"
    done
    echo "| model | logits digest old = new | launches/step old | new | kernels old = new |" >> "$table"
    echo "|---|---|---:|---:|---|" >> "$table"
    for m in $models; do
      name=$(basename $m .gguf)
      declare -A dig cnt kern
      for v in old new; do
        dig[$v]=$(SMELT_CUDA_DIGEST=1 $bin/$v-smelt bench --model $m --device cuda --prompt 64 --gen 48 --reps 1 --host-logits 2>&1 \
          | tee -a "$log" | grep "CUDA digest" | head -1 | awk '{print $3}')
        prof=$(SMELT_CUDA_PROFILE=1 $bin/$v-smelt bench --model $m --device cuda --prompt 64 --gen 8 --reps 1 2>&1 | tee -a "$log")
        cnt[$v]=$(echo "$prof" | sed -n 's/.* in \([0-9.]*\) launches\/step.*/\1/p' | head -1)
        # Kernel name and launches per step, sorted: the set of kernels a decode step runs
        # (not the bench's own pp/tg rows, whose speeds always differ).
        echo "$prof" | awk -F'|' '/^\| [a-z]/ && $2 !~ /kernel/ && $2 !~ /^ *(pp|tg)[0-9]/ {gsub(/ /,"",$2); gsub(/ /,"",$3); print $2, $3}' \
          | sort > $bin/$name-$v.kernels
        kern[$v]=$(md5sum < $bin/$name-$v.kernels | cut -c1-8)
      done
      same_d=$([ -n "${dig[old]}" ] && [ "${dig[old]}" = "${dig[new]}" ] && echo yes || echo "NO (${dig[old]:-none} / ${dig[new]:-none})")
      same_k=$([ -s $bin/$name-old.kernels ] && [ "${kern[old]}" = "${kern[new]}" ] && echo yes || echo NO)
      echo "| $name | $same_d | ${cnt[old]:-?} | ${cnt[new]:-?} | $same_k |" >> "$table"
      if [ "$same_k" != yes ]; then
        echo "== $name: kernels per decode step, old vs new" | tee -a "$log"
        diff $bin/$name-old.kernels $bin/$name-new.kernels | tee -a "$log"
      fi
    done
    echo >> "$table"
    echo "| cut-down real model | cuda_parity (new) | its digests old = new |" >> "$table"
    echo "|---|---|---|" >> "$table"
    for m in $B/smollm2-4l.gguf $B/gemma3-6l.gguf; do
      for v in old new; do
        SMELT_CUDA_DIGEST=1 $bin/$v-cuda_parity check $m > $bin/parity-$v.txt 2>&1
        echo "exit $?" >> $bin/parity-$v.txt
      done
      tail -25 $bin/parity-new.txt >> "$log"
      r=$(grep -q "^exit 0" $bin/parity-new.txt && echo pass || echo FAIL)
      d_old=$(grep "CUDA digest" $bin/parity-old.txt | awk '{print $3}' | tr '\n' ' ')
      d_new=$(grep "CUDA digest" $bin/parity-new.txt | awk '{print $3}' | tr '\n' ' ')
      same=$([ -n "$d_old" ] && [ "$d_old" = "$d_new" ] && echo yes || echo "NO ($d_old/ $d_new)")
      echo "| $(basename $m .gguf) | $r | $same |" >> "$table"
    done
    if [ "${SKIP_SPEED:-0}" != 1 ] && [ -s /tmp/struct15-llama3-8b-q4_k.gguf ]; then
      m=/tmp/struct15-llama3-8b-q4_k.gguf
      for round in $(seq 1 "${ROUNDS:-3}"); do
        for v in old new; do
          r=$($bin/$v-smelt bench --model $m --device cuda --prompt 512 --gen 128 --reps 1 --json 2>/dev/null \
            | grep -o '"decode_tok_s":[0-9.]*' | cut -d: -f2)
          echo "speed round $round $v ${r:-FAILED}" | tee -a "$log"
        done
      done
      echo >> "$table"
      echo "| llama3-8b q4_k, tg128 after 512 (median of ${ROUNDS:-3}) | tok/s |" >> "$table"
      echo "|---|---:|" >> "$table"
      for v in old new; do
        grep "^speed round [0-9]* $v " "$log" | awk '{print $5}' | sort -n \
          | awk -v s=$v '{a[NR]=$1} END {print "| " s " | " a[int((NR+1)/2)] " |"}' >> "$table"
      done
    fi
    echo "== table" | tee -a "$log"
    tee -a "$log" < "$table"
    ;;
  *) echo "usage: $0 build|run" >&2; exit 2 ;;
esac
