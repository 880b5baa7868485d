#!/usr/bin/env bash
# CUDA-vs-CPU parity on the FULL real models (SmolLM2-135M Q4_1, 93 MB, and Gemma 3 270M
# Q4_K_M, 253 MB) on the GPU machine, although one device call carries at most 64 MiB and
# that machine has no network: the models travel in pieces over back-to-back calls, kept on
# the machine between calls while it stays warm (30 s idle), and the call that completes
# the set reassembles them and runs `cuda_parity check` (see its doc comment for the tests
# and bars).
#
# Here:
#   bench/gpu/parity.sh split
#     builds cuda_parity, tars .models/{SmolLM2-135M-Instruct.Q4_1,gemma-3-270m-q4_k_m}.gguf,
#     splits the tar into PIECE_MIB (default 57) MiB pieces in the git-ignored folders
#     .gpu-parity1 .. .gpu-parityN (the stripped, gzipped binary goes with the last piece),
#     each with a copy of MANIFEST (sha256 of every piece, model and the binary), and prints
#     the N device calls to make.
#   bench/gpu/parity.sh bin      # only the binary again, into .gpu-parity-bin (one more call)
# There, N calls back to back (no pause over ~20 s between them, or the machine goes back
# and the pieces with it), each through the device tool with kind nvidia-h200:
#   run command "bash bench/gpu/parity.sh run", carry [".gpu-parityK"], K = 1..N in order.
# Every call copies what it carried into $PARITY_STORE (default $HOME/smelt-parity, outside
# the checkout), checks every piece that has arrived against MANIFEST and lists the missing
# ones; the call that finds all of them reassembles the models (sha256-checked against the
# originals') and runs the parity, log in $OUT/parity.log, summary last. A call that answers
# 'already running' (another run in flight) is retried after 20 s; a piece lost to a fresh
# machine shows as missing: resend from piece 1.
# Per-path probe (one call, no pieces): where along one layer CUDA and CPU part.
#   bench/gpu/parity.sh layers-split   # here: binary + both models cut to 1 layer, 4096
#                                      # embedding rows, into .gpu-parity-layers (~15 MB)
#   bash bench/gpu/parity.sh layers    # there, carry [".gpu-parity-layers"]: 0 layers
#     (embedding, output norm, output matmul), 1 layer with attn_output zeroed (feed-forward
#     path only), with ffn_down zeroed (attention only), and whole; log $OUT/layers.log.
# Environment there: PARITY_SWEEP (depths for the per-layer sweep, default 1,2,6,12,24),
# PARITY_ARGS (extra cuda_parity check flags, e.g. --no-ref).
set -euo pipefail
cd "$(dirname "$0")/../.."
models=(SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf)
case "${1:-}" in
  split)
    cargo build --release -p smelt-engine --example cuda_parity
    for m in "${models[@]}"; do [ -s ".models/$m" ] || { echo "missing .models/$m: scripts/fetch-models.sh all" >&2; exit 1; }; done
    rm -rf .gpu-parity[0-9]* .gpu-parity-bin
    stage=$(mktemp -d)
    tar -C .models -cf "$stage/models.tar" "${models[@]}"
    split -b "${PIECE_MIB:-57}M" -d -a 2 "$stage/models.tar" "$stage/models.tar.part"
    strip -o "$stage/cuda_parity" "${CARGO_TARGET_DIR:-target}/release/examples/cuda_parity"
    gzip -9 "$stage/cuda_parity"
    (cd "$stage" && sha256sum models.tar.part* cuda_parity.gz) > "$stage/MANIFEST"
    (cd .models && sha256sum "${models[@]}") >> "$stage/MANIFEST"
    parts=("$stage"/models.tar.part*)
    n=${#parts[@]}
    for i in $(seq 1 "$n"); do
      d=.gpu-parity$i
      mkdir -p $d
      mv "${parts[$((i - 1))]}" $d/
      cp "$stage/MANIFEST" $d/
    done
    mv "$stage/cuda_parity.gz" .gpu-parity$n/
    rm -rf "$stage"
    du -sh .gpu-parity[0-9]*
    echo "calls (kind nvidia-h200, back to back): command 'bash bench/gpu/parity.sh run', carry:"
    for i in $(seq 1 "$n"); do echo "  [\".gpu-parity$i\"]"; done
    ;;
  bin)
    cargo build --release -p smelt-engine --example cuda_parity
    rm -rf .gpu-parity-bin && mkdir -p .gpu-parity-bin
    strip -o .gpu-parity-bin/cuda_parity "${CARGO_TARGET_DIR:-target}/release/examples/cuda_parity"
    gzip -9 .gpu-parity-bin/cuda_parity
    du -sh .gpu-parity-bin
    ;;
  layers-split)
    cargo build --release -p smelt-engine --example cuda_parity
    B=.gpu-parity-layers
    rm -rf $B && mkdir -p $B
    strip -o $B/cuda_parity "${CARGO_TARGET_DIR:-target}/release/examples/cuda_parity"
    P=$B/cuda_parity
    $P shrink .models/SmolLM2-135M-Instruct.Q4_1.gguf $B/smol-1l.gguf --layers 1 --vocab 4096
    $P shrink .models/gemma-3-270m-q4_k_m.gguf $B/gemma-1l.gguf --layers 1 --vocab 4096
    gzip -9 $P
    du -sh $B
    ;;
  layers)
    B=.gpu-parity-layers
    out=${OUT:-bench/out}
    mkdir -p "$out" /tmp/parity-layers
    log="$out/layers.log"
    T=/tmp/parity-layers
    gunzip -c $B/cuda_parity.gz > $T/cuda_parity && chmod +x $T/cuda_parity
    P=$T/cuda_parity
    { date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } | tee "$log"
    files=()
    for m in smol gemma; do
      $P shrink $B/$m-1l.gguf $T/$m-0l.gguf --layers 0 --vocab 4096 >/dev/null
      $P shrink $B/$m-1l.gguf $T/$m-1l-ffn-only.gguf --layers 1 --vocab 4096 --zero attn_output >/dev/null
      $P shrink $B/$m-1l.gguf $T/$m-1l-attn-only.gguf --layers 1 --vocab 4096 --zero ffn_down >/dev/null
      files+=($T/$m-0l.gguf $T/$m-1l-ffn-only.gguf $T/$m-1l-attn-only.gguf $B/$m-1l.gguf)
    done
    status=0
    $P check "${files[@]}" 2>&1 | tee -a "$log" || status=1
    echo "== summary"
    grep -E "^(==|prompt 40|32 greedy|3 seq)" "$log" | cut -c1-260 || true
    exit $status
    ;;
  run)
    store=${PARITY_STORE:-$HOME/smelt-parity}
    out=${OUT:-bench/out}
    mkdir -p "$store" "$out"
    log="$out/parity.log"
    t0=$SECONDS
    for d in .gpu-parity[0-9]* .gpu-parity-bin; do
      if [ -d "$d" ]; then cp -f "$d"/* "$store"/; fi
    done
    cd "$store"
    # A newly carried binary replaces the one unpacked earlier.
    if [ -s cuda_parity.gz ]; then gunzip -f cuda_parity.gz && chmod +x cuda_parity; fi
    { date -u; hostname; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; } | tee "$log"
    echo "== in $store:" | tee -a "$log"
    ls -la | tee -a "$log"
    [ -s MANIFEST ] || { echo "no MANIFEST: carry a .gpu-parityK folder" | tee -a "$log"; exit 1; }
    missing=0
    while read -r sum name; do
      case "$name" in
        models.tar.part*)
          if [ ! -s "$name" ]; then echo "missing $name" | tee -a "$log"; missing=$((missing + 1))
          elif [ "$(sha256sum "$name" | cut -d' ' -f1)" != "$sum" ]; then
            echo "BAD $name (sha256 differs): removed" | tee -a "$log"; rm -f "$name"; missing=$((missing + 1))
          else echo "ok $name" | tee -a "$log"; fi ;;
      esac
    done < MANIFEST
    if [ $missing -gt 0 ]; then
      echo "== $missing piece(s) still missing; parity not run ($((SECONDS - t0)) s)" | tee -a "$log"
      exit 0
    fi
    [ -x cuda_parity ] || { echo "no cuda_parity binary: carry the last piece or .gpu-parity-bin" | tee -a "$log"; exit 1; }
    ok=1
    for m in "${models[@]}"; do
      want=$(grep " $m\$" MANIFEST | cut -d' ' -f1)
      if [ ! -s "$m" ] || [ "$(sha256sum "$m" | cut -d' ' -f1)" != "$want" ]; then ok=0; fi
    done
    if [ $ok = 0 ]; then
      cat models.tar.part* | tar -xf -
      for m in "${models[@]}"; do
        want=$(grep " $m\$" MANIFEST | cut -d' ' -f1)
        got=$(sha256sum "$m" | cut -d' ' -f1)
        [ "$got" = "$want" ] || { echo "reassembled $m: sha256 $got != $want" | tee -a "$log"; exit 1; }
      done
    fi
    echo "== models reassembled, sha256 equal to the originals ($((SECONDS - t0)) s)" | tee -a "$log"
    ls -la "${models[@]}" | tee -a "$log"
    status=0
    # shellcheck disable=SC2086
    ./cuda_parity check "${models[@]}" --sweep "${PARITY_SWEEP:-1,2,6,12,24}" ${PARITY_ARGS:-} 2>&1 \
      | tee -a "$log" || status=1
    echo "== summary ($((SECONDS - t0)) s)"
    grep -E "^(==|prompt|32 greedy|greedy|3 seq|sweep|parity|  cpu |  cuda |    row|.*: (PASS|FAIL) )" "$log" || true
    exit $status
    ;;
  *)
    sed -n 2,30p "$0" >&2
    exit 2
    ;;
esac
