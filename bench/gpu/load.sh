#!/usr/bin/env bash
# Load and quantize at the speed of the disk (issue 20), in one device call, the issue's
# must-show table last:
# - checks first (not timed; a failure skips the rest): the repack kernels (ggml blocks
#   into the GEMV's rows on the device) against their CPU twin for every GEMV format
#   (gpu_ops -o repack), and the model `smelt run --isq T --device cuda` puts on
#   the device (quantized and repacked there, never back on the host) against the model the
#   file `smelt quantize --type T --device cuda` writes, byte for byte
#   (SMELT_CUDA_WEIGHT_DIGEST=1 hashes every weight in device memory), for q6_k (repacked)
#   and q4_k_m (Q4_K written in place). The device path is the default since this run
#   showed it (2026-11-27); the rows set SMELT_ISQ_ON_DEVICE=1 / 0 to say which they time;
# - a bf16 Llama-3-8B-shape GGUF (smelt synth; SmolLM2's tokenizer, so its vocabulary of
#   49,152: 14.8 GB) read by `cat` (page cache warm, and cold when drop_caches works) beside
#   `smelt quantize --device cuda` to q6_k and q4_k_m, `smelt run --isq q6_k --device cuda`
#   to its first tokens (on the device, and through host memory as before) with a breakdown
#   of where its time goes, the CPU quantizer on all cores and `cmp` of the GPU and CPU files;
#   each `smelt quantize` with its own breakdown (setup, reading, completing, writing: its
#   `timing:`/`stages:` lines), and q6_k written five ways in the same call (SMELT_WRITE=
#   serial, the stream of before; placed, pwrite at known offsets, with 1 writer thread, the
#   default, and 4; mmap with 4 and 8), each file compared with the default's; a `sync`
#   before every timed write;
# - the 8B Q4_K file: `smelt serve` from launch to its first answered request (kernel cache
#   warm, page cache warm and dropped) beside llama.cpp's model load of the same file
#   (LLAMACPP=1, the default: built in the background while the checks run, ~3 min);
# - the largest bf16 shape that fits the disk with its outputs (BIG=1, the default:
#   qwen3-14b, ~29 GB) the same way, with the CPU quantizer beside it.
#
# - the default run (~4 minutes, FULL=0): only the 8B rows, main's binary against this
#   tree's in the same call (A/B, two rounds, alternating): the warm read, `quantize --device
#   cuda` q6_k and q4_k_m with each run's stage times, `run --isq q6_k` to 8 tokens, the CPU
#   quantizer's q6_k and q4_k_m files compared with the GPU's (and main's GPU file with
#   this tree's), and on a host with several GPUs the same q6_k with every GPU visible
#   (SMELT_CUDA_ALL_DEVICES=1), and q6_k with SMELT_WRITE_ALLOC=sparse and SMELT_WRITE_PREFAULT=0
#   (the prefault on by default since 2026-11-28);
#   FULL=1 adds the checks, the write-mode A/B, serve and
#   llama.cpp, the cold rows and the 14B shape (each also on its own: CHECKS=1, WRITE_AB=1,
#   SERVE=1, LLAMACPP=1, COLD=1, BIG=1).
#
# Here:  cargo build --release -p smelt (and for CHECKS=1: cargo build --release -p
#        smelt-kernels --example gpu_ops)
#        MAIN_SMELT=/path/to/main's/release/smelt bench/gpu/load.sh pack   (strips and xz's
#            them into .gpu-load/, with tok.gguf.xz: a GGUF holding only SmolLM2's
#            tokenizer keys; without MAIN_SMELT no A/B)
#        ../shared/peer/prepare.sh .peer   (LLAMACPP=1 only: llama.cpp's sdist)
# There: timeout 400 bash bench/gpu/load.sh    carry [".gpu-load"]   (~4 minutes)
#        FULL=1 timeout 590 bash bench/gpu/load.sh    carry [".gpu-load", ".peer"]
# Environment: BUDGET seconds (default 360; FULL=1: 540): optional phases start only with
# time left, and every command has a hard timeout. NOCACHE=1 adds a serve start with no
# kernel cache (the whole catalog's JIT, ~30 s). A dry run of the logic on a CPU machine:
#   SHAPE8=llama3-tiny SHAPE14=qwen3-tiny DEV=cpu bash bench/gpu/load.sh
# Output: the rows on stdout as they come and the table last; details in $OUT/load.log (or
# bench/out), which holds only stderr lines of the commands (no data).
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = pack ]; then
    # xz: the carry limit (64 MiB) holds the working tree (~9 MB) and .peer (~52 MB) too.
    set -e
    t=${CARGO_TARGET_DIR:-target}
    mkdir -p .gpu-load
    rm -f .gpu-load/*
    strip -o /tmp/smelt-pack "$t/release/smelt"
    xz -9e -T2 -c /tmp/smelt-pack > .gpu-load/smelt.xz
    if [ -x "$t/release/examples/gpu_ops" ]; then
        strip -o /tmp/qc-pack "$t/release/examples/gpu_ops"
        xz -9e -T2 -c /tmp/qc-pack > .gpu-load/gpu_ops.xz
    fi
    if [ -n "${MAIN_SMELT:-}" ]; then
        strip -o /tmp/smelt-main-pack "$MAIN_SMELT"
        xz -9e -T2 -c /tmp/smelt-main-pack > .gpu-load/smelt-main.xz
    fi
    # SmolLM2's tokenizer keys alone (no tensors): what `smelt synth --tokenizer-from` reads.
    scripts/fetch-models.sh smollm2-135m > /dev/null
    py=$(ls /root/.cache/smelt/venv-llcpp-*/bin/python 2>/dev/null | head -1)
    [ -n "$py" ] || { echo "pack: needs gguf-py (scripts/oracles.sh makes its venv)" >&2; exit 1; }
    "$py" - .models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/tok-only.gguf <<'PY'
import sys, gguf
r = gguf.GGUFReader(sys.argv[1])
w = gguf.GGUFWriter(sys.argv[2], "llama")
for name, f in r.fields.items():
    if name.startswith("tokenizer."):
        t = f.types[0]
        sub = f.types[1] if t == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), t, sub_type=sub)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
PY
    xz -9e -c /tmp/tok-only.gguf > .gpu-load/tok.gguf.xz
    du -cb .gpu-load/*
    exit 0
fi
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/load.log"
table="$out/load-table.md"
checks="$out/load-checks.md"
breakdown="$out/load-breakdown.md"
qbreak="$out/load-quantize-stages.md"
W=${LOAD_DIR:-/tmp/load}
rm -rf "$W"; mkdir -p "$W"
S=$W/smelt; Q=$W/gpu_ops; TOK=$W/tok.gguf; M=$W/smelt-main
xz -dc .gpu-load/smelt.xz > $S && chmod +x $S
[ -s .gpu-load/smelt-main.xz ] && xz -dc .gpu-load/smelt-main.xz > $M && chmod +x $M
xz -dc .gpu-load/tok.gguf.xz > $TOK
[ -s .gpu-load/gpu_ops.xz ] && xz -dc .gpu-load/gpu_ops.xz > $Q && chmod +x $Q
T0=$EPOCHREALTIME
FULL=${FULL:-0}
[ "$FULL" = 1 ] && BUDGET=${BUDGET:-540} || BUDGET=${BUDGET:-360}
SHAPE8=${SHAPE8:-llama3-8b}; SHAPE14=${SHAPE14:-qwen3-14b}; DEV=${DEV:-cuda}
LLAMACPP=${LLAMACPP:-$FULL}; BIG=${BIG:-$FULL}; CHECKS=${CHECKS:-$FULL}
WRITE_AB=${WRITE_AB:-$FULL}; SERVE=${SERVE:-$FULL}; COLD=${COLD:-$FULL}
abt="$out/load-ab.md"
printf '| 8B bf16 (this tree vs main, same call) | main s | this tree s | main / read | this tree / read |\n|---|---:|---:|---:|---:|\n' > "$abt"
export SMELT_CUDA_LOAD_LOG=1
export XDG_CACHE_HOME=$W/cache
: > "$table"; : > "$checks"; : > "$breakdown"
printf '| smelt quantize run | where its time went (its own clock; wall minus "in all" is the process exit) |\n|---|---|\n' > "$qbreak"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  echo "cores $(nproc)"; free -g | head -2; df -h "$W" | tail -1; } 2>&1 | tee "$log"

now() { awk -v a="$EPOCHREALTIME" -v b="$T0" 'BEGIN { printf "%.0f", a - b }'; }
left() { awk -v a="$EPOCHREALTIME" -v b="$T0" -v c="$BUDGET" 'BEGIN { printf "%.0f", c - (a - b) }'; }
# secs [-t SECONDS] CMD...: runs CMD under a timeout (stdout to /dev/null, stderr to the
# log), prints its wall seconds, and its exit status when not 0.
secs() {
    local tmo=100
    if [ "$1" = -t ]; then tmo=$2; shift 2; fi
    local s=$EPOCHREALTIME rc
    echo "\$ $*" >> "$log"
    timeout "$tmo" "$@" > /dev/null 2>> "$log"; rc=$?
    awk -v a="$EPOCHREALTIME" -v b="$s" 'BEGIN { printf "%.2f", a - b }'
    [ $rc = 0 ] || printf " (rc=%s)" $rc
}
# tokens FILE CMD...: runs CMD (a `smelt run --json`), keeps its generated tokens in FILE
# and its stderr in FILE.err (and the log), prints its wall seconds.
tokens() {
    local f=$1 s=$EPOCHREALTIME rc; shift
    echo "\$ $*" >> "$log"
    timeout 150 "$@" 2> "$f.err" | tail -1 | grep -o '"tokens":\[[0-9,]*\]' > "$f"; rc=${PIPESTATUS[0]}
    awk -v a="$EPOCHREALTIME" -v b="$s" 'BEGIN { printf "%.2f", a - b }' > "$f.wall"
    grep -av "^\s*$" "$f.err" | cut -c1-300 >> "$log"
    cat "$f" >> "$log"
    cat "$f.wall"
    [ $rc = 0 ] || printf " (rc=%s)" $rc
}
same() { [ -s "$1" ] && cmp -s "$1" "$2" && echo SAME || echo DIFFER; }
digest() { grep -ao "weights digest: [0-9a-f]* ([0-9]* weights, [0-9]* bytes)" "$1" | tail -1; }
row() { echo "| $1 | $2 | $3 |" | tee -a "$log" "$table"; }
check() { echo "| $1 | $2 |" | tee -a "$log" "$checks"; }
head2() { printf '| %s | seconds | %s |\n|---|---:|---|\n' "$1" "$2" | tee -a "$log" "$table"; }
cold() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; }
can_drop() { cold; [ "$(awk '/^Cached:/ {print $2}' /proc/meminfo)" -lt 4000000 ]; }
ratio() { awk -v a="${1%% *}" -v b="$2" 'BEGIN { if (a + 0 > 0 && b > 0) printf "%.2fx read", a / b; else print "-" }'; }
gbs() { awk -v f="$1" -v t="${2%% *}" 'BEGIN { if (t > 0) printf "%.2f GB/s", f / t / 1e9; else print "-" }'; }
gb() { awk -v b="$(stat -c %s "$1" 2>/dev/null || echo 0)" 'BEGIN { printf "%.2f GB", b / 1e9 }'; }
catn() { cat "$1" > /dev/null; }
last_wrote() { grep -a "^wrote" "$log" | tail -1 | sed 's/.*; read/read/'; }
# stages NAME: the last quantize's own breakdown (its `timing:` and `stages:` lines, printed
# under SMELT_CUDA_LOAD_LOG=1) as rows of the quantize breakdown table.
# Only lines after the log's last command (a run that failed before printing them shows none,
# not the previous run's).
qstages() {
    local own
    own=$(awk '/^\$ / { buf = "" } { buf = buf $0 "\n" } END { printf "%s", buf }' "$log")
    { echo "| $1 | $(grep -a "^timing:" <<< "$own" | tail -1 | sed 's/^timing: //') |"
      echo "| | $(grep -a "^stages:" <<< "$own" | tail -1 | sed 's/^stages: //') |"; } >> "$qbreak"
}
FAILED=0
ids=$(seq -s, 100 1 116)

if [ "$LLAMACPP" = 1 ]; then
    echo "== llama.cpp build in the background (checks meanwhile; timings wait for it)" | tee -a "$log"
    ( d=$PWD/.peer; cd /tmp && tar xzf $d/llcpp.tgz &&
      python3 -m pip install -q --no-index --no-deps --target /tmp/site $d/*.whl &&
      CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF" \
      CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout 330 nice -n 10 python3 -m pip install -q --no-build-isolation --no-deps \
          --no-index --target /tmp/site ./llama_cpp_python-*/ ) > "$W/llcpp-build.log" 2>&1 &
    BUILD_PID=$!
    BUILD_T0=$EPOCHREALTIME
fi

echo "== checks ($(now) s)" | tee -a "$log"
printf '| check | result |\n|---|---|\n' | tee -a "$log" "$checks"
if [ "$CHECKS" = 1 ] && [ "$DEV" = cuda ] && [ -x "$Q" ]; then
    timeout 120 $Q -o repack > "$W/repack.txt" 2>&1; rc=$?
    cat "$W/repack.txt" >> "$log"
    grep "^| repack " "$W/repack.txt" | sed 's/^ */  /'
    n=$(grep "^| repack " "$W/repack.txt" | grep -c "| PASS |")
    [ $rc = 0 ] && [ "$n" -ge 12 ] && r="PASS ($n formats)" || { r="FAIL (rc=$rc, $n formats pass)"; FAILED=1; }
    check "repack kernels vs CPU twin (catalog::repack), every GEMV format, ragged rows, poisoned outputs" "$r"
fi
# The kernel cache filled by a tiny model (the catalog's JIT, ~30 s on one core), while
# the 8B file is written.
secs -t 120 $S synth --shape llama3-tiny --quant bf16 --tokenizer-from $TOK -o $W/tiny.gguf > /dev/null
( timeout 150 $S quantize $W/tiny.gguf $W/tiny-q6k.gguf --type q6_k --device $DEV > /dev/null 2>> "$log" ) &
WARM_PID=$!
bf=$W/l8-bf16.gguf
s=$(secs -t 150 $S synth --shape $SHAPE8 --quant bf16 --tokenizer-from $TOK -o $bf)
size=$(stat -c %s $bf 2>/dev/null || echo 0)
echo "synth 8B bf16: $s s, $size bytes; $(df -h $W | tail -1)" | tee -a "$log"
wait $WARM_PID
echo "kernel cache warm ($(now) s)" | tee -a "$log"
for t in q6_k q4_k_m; do
    [ "$CHECKS" = 1 ] || continue
    f=$W/l8-$t-gpu.gguf
    secs -t 100 $S quantize $bf $f --type $t --device $DEV > /dev/null
    SMELT_CUDA_WEIGHT_DIGEST=1 tokens $W/dfile-$t.tok $S run --model $f --device $DEV --prompt-ids $ids --max-tokens 8 --json > /dev/null
    SMELT_ISQ_ON_DEVICE=1 SMELT_CUDA_WEIGHT_DIGEST=1 tokens $W/disq-$t.tok $S run --model $bf --isq $t --device $DEV --prompt-ids $ids --max-tokens 8 --json > /dev/null
    a=$(digest $W/dfile-$t.tok.err); b=$(digest $W/disq-$t.tok.err)
    if [ "$DEV" = cuda ]; then
        [ -n "$a" ] && [ "$a" = "$b" ] && r="SAME: $a" || { r="DIFFER: file '$a', --isq '$b'"; FAILED=1; }
        check "device weights of --isq $t (quantized and repacked on the GPU) vs the $t file's" "$r"
    fi
    r=$(same $W/dfile-$t.tok $W/disq-$t.tok)
    [ "$r" = SAME ] || FAILED=1
    check "8 greedy tokens, --isq $t vs the $t file" "$r"
    [ $t = q4_k_m ] && rm -f $f
done
if [ "$FAILED" = 1 ]; then
    echo "== a check FAILED: timings skipped" | tee -a "$log"
    [ -n "${BUILD_PID:-}" ] && kill -- "$BUILD_PID" 2>/dev/null
    cat "$checks"
    exit 1
fi
q4=$W/l8-q4k.gguf
if [ "$SERVE" = 1 ] || [ "$LLAMACPP" = 1 ]; then
    secs -t 120 $S synth --shape $SHAPE8 --quant q4_k --tokenizer-from $TOK -o $q4 > /dev/null
fi
q4size=$(stat -c %s $q4 2>/dev/null || echo 0)
if [ -n "${BUILD_PID:-}" ]; then
    echo "== waiting for the llama.cpp build ($(now) s)" | tee -a "$log"
    wait "$BUILD_PID"; brc=$?
    echo "llama.cpp build: rc=$brc, $(awk -v a="$EPOCHREALTIME" -v b="$BUILD_T0" 'BEGIN { printf "%.0f", a - b }') s" | tee -a "$log"
    [ $brc = 0 ] || { tail -20 "$W/llcpp-build.log" >> "$log"; LLAMACPP=0; }
fi

echo "== 8B bf16 ($(now) s)" | tee -a "$log"
head2 "8B bf16, $(gb $bf)" "vs read / rate"
# Every timed write starts with no dirty pages of earlier steps left to flush: writeback
# throttling of someone else's bytes is not this command's time.
sync
catn $bf
catw=$(secs cat $bf)
row "cat > /dev/null (page cache warm)" "$catw" "$(gbs $size $catw)"
# main's binary (A) against this tree's (B), alternating, two rounds: each quantize with its
# own stage times, `run --isq q6_k` to 8 tokens. The first q6_k file of B is kept: the CPU
# quantizer's file and A's are compared with it.
ab() { # ab LABEL BIN KIND ROUND: prints the wall seconds of one timed command
    local bin=$2 kind=$3 f s alloc= pf=
    [ $kind = sparse ] && { kind=q6_k; alloc=sparse; }
    [ $kind = prefault ] && { kind=q6_k; alloc=prefault; pf=0; }  # label: SMELT_WRITE_PREFAULT=0
    case $kind in
    q6_k|q4_k_m)
        f=$W/l8-ab-$1-$kind.gguf
        sync
        s=$(SMELT_WRITE_ALLOC=${alloc%prefault} SMELT_WRITE_PREFAULT=$pf secs $bin quantize $bf $f --type $kind --device $DEV)
        qstages "8B $kind --device $DEV, $1${alloc:+, $([ -n "$pf" ] && echo SMELT_WRITE_PREFAULT=0 || echo SMELT_WRITE_ALLOC=$alloc)}, round $4, $s s wall"
        if [ $kind = q6_k ] && [ -n "$alloc" ]; then
            echo "$(same $f $W/l8-q6_k-gpu.gguf)" > $W/$alloc-same
            rm -f $f
        elif [ $kind = q6_k ] && [ $1 = branch ] && [ ! -s $W/l8-q6_k-gpu.gguf ]; then
            mv $f $W/l8-q6_k-gpu.gguf
        elif [ $kind = q6_k ] && [ $1 = main ] && [ ! -s $W/l8-q6_k-main.gguf ]; then
            mv $f $W/l8-q6_k-main.gguf
        else
            rm -f $f
        fi ;;
    isq)
        s=$(SMELT_ISQ_ON_DEVICE=1 tokens $W/isq-$1-$4.tok $bin run --model $bf --isq q6_k --device $DEV --prompt-ids $ids --max-tokens 8 --json) ;;
    esac
    echo "$s"
}
declare -A AB
for round in 1 2; do
    for kind in q6_k q4_k_m isq sparse prefault; do
        [ -x "$M" ] && [ $kind != sparse ] && [ $kind != prefault ] && AB[main-$kind-$round]=$(ab main $M $kind $round)
        AB[branch-$kind-$round]=$(ab branch $S $kind $round)
    done
done
for kind in q6_k q4_k_m isq sparse prefault; do
    case $kind in
    prefault) what="quantize q6_k, SMELT_WRITE_PREFAULT=0 (no thread faulting the output's pages in ahead of the writer)" ;;
    isq) what="smelt run --isq q6_k --device $DEV: launch to 8 tokens" ;;
    sparse) what="quantize q6_k, SMELT_WRITE_ALLOC=sparse (output sized by ftruncate, as main)" ;;
    *) what="smelt quantize --device $DEV --type $kind" ;;
    esac
    for round in 1 2; do
        a=${AB[main-$kind-$round]:--}; b=${AB[branch-$kind-$round]:--}
        row "$what (round $round)" "$b" "$(ratio "$b" $catw); main's binary: $a s ($(ratio "$a" $catw))"
        echo "| $what, round $round | ${a%% *} | ${b%% *} | $(ratio "$a" $catw) | $(ratio "$b" $catw) |" | tee -a "$log" >> "$abt"
    done
done
row "cmp q6_k: the SMELT_WRITE_ALLOC=sparse file (round 2) vs the default's" "-" "$(cat $W/sparse-same 2>/dev/null)"
row "cmp q6_k: the SMELT_WRITE_PREFAULT=0 file (round 2) vs the default's" "-" "$(cat $W/prefault-same 2>/dev/null)"
if [ -x "$M" ]; then
    row "cmp q6_k: main's GPU file vs this tree's" "-" "$(same $W/l8-q6_k-main.gguf $W/l8-q6_k-gpu.gguf)"
    row "8 greedy tokens of --isq q6_k: main vs this tree" "-" "$(same $W/isq-main-1.tok $W/isq-branch-1.tok)"
fi
rm -f $W/l8-q6_k-main.gguf
cp $W/isq-branch-2.tok.err $W/isq.tok.err 2>/dev/null
cp $W/isq-branch-2.tok $W/isq.tok 2>/dev/null
isq_wall=${AB[branch-isq-2]}
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
if [ "$DEV" = cuda ] && [ "${ngpu:-0}" -gt 1 ]; then
    # Start-up with every GPU of the host visible (as before) against only the one used.
    for v in 1 0; do
        sync
        s=$(SMELT_CUDA_ALL_DEVICES=$v secs $S quantize $bf $W/l8-vis.gguf --type q6_k --device $DEV)
        qstages "8B q6_k, SMELT_CUDA_ALL_DEVICES=$v ($ngpu GPUs), $s s wall"
        row "quantize q6_k, SMELT_CUDA_ALL_DEVICES=$v ($ngpu GPUs on the host)" "$s" "$(ratio "$s" $catw); $(grep -a "^timing:" "$log" | tail -1 | grep -o "cuda:0 ready [0-9.]* s")"
        rm -f $W/l8-vis.gguf
    done
fi
# How the output is written, A/B in one call: one buffered stream in order, the file growing
# as it goes (SMELT_WRITE=serial, before 2026-11-27) against writer threads at known offsets
# of a file created at its size (pwrite: the default, 1 thread, and 4 to see whether they
# scale past the inode lock; mmap: copies into a shared mapping, 4 and 8 threads); each file
# compared with the default's.
# The last two only with time to spare (the 14B rows come later; 2026-11-27's run reached
# this point with 282 s left and still had ~110 s to spare at its end).
for m in serial:1 mmap:4 mmap:8 placed:1 placed:4; do
    [ "$WRITE_AB" = 1 ] || continue
    case $m in placed:4) need=260 ;; *) need=220 ;; esac
    [ "$(left)" -gt $need ] || continue
    sync
    f=$W/l8-q6k-ab.gguf
    s=$(SMELT_WRITE=${m%%:*} SMELT_WRITE_THREADS=${m##*:} secs $S quantize $bf $f --type q6_k --device $DEV)
    row "same q6_k, SMELT_WRITE=${m%%:*} SMELT_WRITE_THREADS=${m##*:}" "$s" "$(ratio "$s" $catw); file vs the q6_k file: $(same $f $W/l8-q6_k-gpu.gguf); $(last_wrote)"
    qstages "8B q6_k, SMELT_WRITE=${m%%:*}, ${m##*:} thread(s), $s s wall"
    rm -f $f
done
if [ "$FULL" = 1 ]; then
s=$(SMELT_ISQ_ON_DEVICE=0 tokens $W/isqhost.tok $S run --model $bf --isq q6_k --device $DEV --prompt-ids $ids --max-tokens 8 --json)
row "same through host memory (SMELT_ISQ_ON_DEVICE=0: quantize, download, repack on the host, upload)" "$s" "$(ratio "$s" $catw); tokens vs on the device: $(same $W/isq.tok $W/isqhost.tok)"
s=$(tokens $W/file.tok $S run --model $W/l8-q6_k-gpu.gguf --device $DEV --prompt-ids $ids --max-tokens 8 --json)
row "smelt run of the q6_k file --device $DEV: launch to 8 tokens" "$s" "$(ratio "$s" $catw); tokens vs --isq: $(same $W/isq.tok $W/file.tok)"
fi

# Where `smelt run --isq q6_k`'s time goes (its load log; see backend/cuda/runner.rs).
e=$W/isq.tok.err
num() { grep -ao "$1" "$e" | tail -1 | grep -o "[0-9.]*" | head -${2:-1} | tail -1; }
ready_launch=$(num "engine ready [0-9.]* s after launch")
ready_dev=$(num "engine ready [0-9.]* s after the device")
open_k=$(num "device open + kernels [0-9.]* s")
kern_ms=$(num "ready in [0-9]* ms")
weights=$(num "weights [0-9.]* s")
reading=$(num "host reading [0-9.]* s")
waiting=$(num "waiting for slots [0-9.]* s")
kvs=$(num "KV cache [0-9.]* s")
gen=$(num "generated [0-9.]* s after launch")
pms=$(num "prompt [0-9.]* ms")
dms=$(num "decode [0-9.]* ms")
{
printf '| smelt run --isq q6_k --device %s, %s s wall | seconds |\n|---|---:|\n' "$DEV" "${isq_wall%% *}"
awk -v rl="$ready_launch" -v rd="$ready_dev" -v ok="$open_k" -v km="$kern_ms" -v w="$weights" \
    -v rr="$reading" -v wt="$waiting" -v kv="$kvs" -v g="$gen" -v p="$pms" -v d="$dms" -v wall="${isq_wall%% *}" 'BEGIN {
    printf "| launch to the device asked for (arguments, ISQ plan, file mapped) | %.2f |\n", rl - rd
    printf "| CUDA context + kernel module (cubin cache: %.0f ms of it) | %.2f |\n", km, ok
    printf "| weights: read, upload, quantize, repack on the device | %.2f |\n", w
    printf "|   of which the host reading the file (parallel preads, overlapped) | %.2f |\n", rr
    printf "|   of which the host waiting for a free slot (GPU behind) | %.2f |\n", wt
    printf "| KV cache (and its measuring step) | %.2f |\n", kv
    printf "| prompt (17 tokens) to the first token | %.3f |\n", p / 1000
    printf "| 7 more tokens | %.3f |\n", d / 1000
    printf "| process exit after the last token (freeing device and pinned memory) | %.2f |\n", wall - g
}'
} | tee -a "$log" "$breakdown"

if [ "$SERVE" = 1 ] || [ "$LLAMACPP" = 1 ]; then
echo "== 8B Q4_K: serve cold start, llama.cpp load ($(now) s)" | tee -a "$log"
head2 "8B Q4_K, $(gb $q4)" "note"
catn $q4
catq=$(secs cat $q4)
row "cat > /dev/null (warm)" "$catq" "$(gbs $q4size $catq)"
serve_first() { # prints seconds from launch to the first answered completion
    timeout 150 python3 - "$S" "$q4" "$1" "$DEV" 2>>"$log" <<'PY'
import json, subprocess, sys, time, urllib.request
smelt, model, port, dev = sys.argv[1:5]
t0 = time.perf_counter()
p = subprocess.Popen([smelt, "serve", "-m", model, "--device", dev, "--port", port],
                     stdout=subprocess.DEVNULL, stderr=open("/tmp/serve-load.err", "w"))
ok = None
body = None
while time.perf_counter() - t0 < 120 and p.poll() is None:
    try:
        if body is None:
            m = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5))
            body = json.dumps({"model": m["data"][0]["id"], "prompt": "Hello",
                               "max_tokens": 1}).encode()
        r = urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", body,
            {"Content-Type": "application/json"}), timeout=30)
        if r.status == 200:
            ok = time.perf_counter() - t0
            break
    except Exception:
        time.sleep(0.02)
p.terminate(); p.wait()
print(f"{ok:.2f}" if ok else "FAIL")
PY
    grep -av "^\s*$" /tmp/serve-load.err | tail -5 >> "$log"
}
llama_load() { # prints "load_seconds total_seconds" of llama.cpp on $q4
    PYTHONPATH=/tmp/site timeout 120 python3 - "$q4" 2>>"$log" <<'PY'
import ctypes, sys, time
t0 = time.perf_counter()
import llama_cpp as L
L.llama_backend_init()
mp = L.llama_model_default_params(); mp.n_gpu_layers = 999
t1 = time.perf_counter()
model = L.llama_model_load_from_file(sys.argv[1].encode(), mp)
t2 = time.perf_counter()
cp = L.llama_context_default_params(); cp.n_ctx = 4096
ctx = L.llama_init_from_model(model, cp)
toks = (ctypes.c_int32 * 1)(100)
assert L.llama_decode(ctx, L.llama_batch_get_one(toks, 1)) == 0
L.llama_synchronize(ctx)
t3 = time.perf_counter()
print(f"{t2 - t1:.2f} {t3 - t0:.2f}")
PY
}
if [ "${NOCACHE:-0}" = 1 ]; then
    rm -rf "$XDG_CACHE_HOME" ~/.nv/ComputeCache
    s=$(serve_first 8390)
    row "smelt serve --device $DEV: launch to first answer (no kernel cache: JIT)" "$s" "$(ratio "$s" $catq)"
fi
s=$(serve_first 8391)
row "smelt serve --device $DEV: launch to first answer (kernel cache warm)" "$s" "$(ratio "$s" $catq)"
if [ "$LLAMACPP" = 1 ]; then
    r=$(llama_load)
    row "llama.cpp llama_model_load_from_file (all layers on the GPU)" "${r%% *}" "$(ratio "${r%% *}" $catq)"
    row "llama.cpp import + load + context + first decode" "${r##* }" "$(ratio "${r##* }" $catq)"
fi
if can_drop; then
    catc=$(secs cat $q4)
    row "cat > /dev/null (cold: caches dropped)" "$catc" "$(gbs $q4size $catc)"
    cold
    s=$(serve_first 8392)
    row "smelt serve --device $DEV, page cache dropped: launch to first answer" "$s" "$(ratio "$s" $catc) (cold)"
    if [ "$LLAMACPP" = 1 ]; then
        cold
        r=$(llama_load)
        row "llama.cpp load, page cache dropped" "${r%% *}" "$(ratio "${r%% *}" $catc) (cold); with context + first decode ${r##* } s"
    fi
fi
s=$(tokens $W/new.tok $S run --model $q4 --device $DEV --prompt-ids $ids --max-tokens 8 --json)
row "smelt run --device $DEV: launch to 8 tokens" "$s" "$(ratio "$s" $catq)"
rm -f $q4
fi

echo "== CPU quantizer, cold reads ($(now) s)" | tee -a "$log"
head2 "8B bf16 again" "note"
# With the 14B rows to come, the CPU rows wait for time to spare for them.
[ "$BIG" = 1 ] && spare=200 || spare=40
if [ "$(left)" -gt $spare ]; then
    sync
    s=$(secs -t 100 $S quantize $bf $W/l8-q6k-cpu.gguf --type q6_k)
    row "smelt quantize --device cpu q6_k ($(nproc) cores)" "$s" "$(ratio "$s" $catw); $(last_wrote)"
    qstages "8B q6_k --device cpu, $s s wall"
    row "cmp q6_k: GPU file vs CPU file" "-" "$(cmp $W/l8-q6_k-gpu.gguf $W/l8-q6k-cpu.gguf >> "$log" 2>&1 && echo SAME || echo DIFFER)"
    rm -f $W/l8-q6k-cpu.gguf
else
    row "CPU quantizer" "-" "skipped (time)"
fi
rm -f $W/l8-q6_k-gpu.gguf
if [ "$COLD" = 1 ] && [ "$(left)" -gt 180 ] && can_drop; then
    catc=$(secs cat $bf)
    row "cat > /dev/null (cold: caches dropped)" "$catc" "$(gbs $size $catc)"
    cold
    s=$(secs -t 60 $S quantize $bf $W/l8-q6k-cold.gguf --type q6_k --device $DEV)
    row "smelt quantize --device $DEV q6_k (cold)" "$s" "$(ratio "$s" $catc); $(last_wrote)"
    qstages "8B q6_k --device $DEV, page cache dropped, $s s wall"
    rm -f $W/l8-q6k-cold.gguf
    cold
    s=$(SMELT_ISQ_ON_DEVICE=1 tokens $W/isqcold.tok $S run --model $bf --isq q6_k --device $DEV --prompt-ids $ids --max-tokens 8 --json)
    row "smelt run --isq q6_k --device $DEV (cold): launch to 8 tokens" "$s" "$(ratio "$s" $catc)"
fi
if [ "$(left)" -gt $(( spare + 30 )) ]; then
    $S quantize $bf $W/l8-q4km-gpu.gguf --type q4_k_m --device $DEV > /dev/null 2>> "$log"
    sync
    s=$(secs -t 120 $S quantize $bf $W/l8-q4km-cpu.gguf --type q4_k_m)
    row "smelt quantize --device cpu q4_k_m" "$s" "$(ratio "$s" $catw); $(last_wrote)"
    qstages "8B q4_k_m --device cpu, $s s wall"
    row "cmp q4_k_m: GPU file vs CPU file" "-" "$(cmp $W/l8-q4km-gpu.gguf $W/l8-q4km-cpu.gguf >> "$log" 2>&1 && echo SAME || echo DIFFER)"
    rm -f $W/l8-q4km-cpu.gguf $W/l8-q4km-gpu.gguf
fi
rm -f $bf

if [ "$BIG" = 1 ] && [ "$(left)" -gt 120 ]; then
    echo "== 14B bf16 ($(now) s)" | tee -a "$log"
    b14=$W/q14-bf16.gguf
    s=$(secs -t 150 $S synth --shape $SHAPE14 --quant bf16 --tokenizer-from $TOK -o $b14)
    size=$(stat -c %s $b14 2>/dev/null || echo 0)
    echo "synth 14B: $s s; $(df -h $W | tail -1)" | tee -a "$log"
    head2 "$SHAPE14 bf16, $(gb $b14)" "vs read"
    sync
    catn $b14
    c14=$(secs cat $b14)
    row "cat > /dev/null (warm)" "$c14" "$(gbs $size $c14)"
    sync
    s=$(secs $S quantize $b14 $W/q14-q6k-gpu.gguf --type q6_k --device $DEV)
    row "smelt quantize --device $DEV q6_k" "$s" "$(ratio "$s" $c14); $(last_wrote)"
    qstages "14B q6_k --device $DEV, $s s wall"
    s=$(SMELT_ISQ_ON_DEVICE=1 tokens $W/isq14.tok $S run --model $b14 --isq q6_k --device $DEV --prompt-ids $ids --max-tokens 8 --json)
    row "smelt run --isq q6_k --device $DEV: launch to 8 tokens" "$s" "$(ratio "$s" $c14)"
    if [ "$(left)" -gt 45 ]; then
        # Both outputs do not fit a 64 GB disk beside the input (2026-11-27: ENOSPC): the
        # GPU file's digest is kept instead when room is short.
        gpu14=$W/q14-q6k-gpu.gguf
        avail=$(df -B1 --output=avail "$W" | tail -1)
        if [ "$avail" -lt $(( $(stat -c %s $gpu14) + (2 << 30) )) ]; then
            sha256sum < $gpu14 > $W/q14-gpu.sha; rm -f $gpu14; gpu14=$W/q14-gpu.sha
        fi
        sync
        s=$(secs -t $(( $(left) - 10 )) $S quantize $b14 $W/q14-q6k-cpu.gguf --type q6_k)
        row "smelt quantize --device cpu q6_k ($(nproc) cores)" "$s" "$(ratio "$s" $c14); $(last_wrote)"
        qstages "14B q6_k --device cpu, $s s wall"
        if [ "$gpu14" = $W/q14-gpu.sha ]; then
            r=$(sha256sum < $W/q14-q6k-cpu.gguf | cmp -s - $gpu14 && echo "SAME (sha256)" || echo DIFFER)
        else
            r=$(cmp $gpu14 $W/q14-q6k-cpu.gguf >> "$log" 2>&1 && echo SAME || echo DIFFER)
        fi
        row "cmp q6_k GPU vs CPU" "-" "$r"
    fi
    rm -f $W/q14-q6k-gpu.gguf $W/q14-q6k-cpu.gguf $b14
fi
echo "== load summaries" | tee -a "$log"
grep -ah "kernels:\|quantized to\|^wrote\|weights to\|as they loaded\|cuda:0 load:" "$log" | cut -c1-260 | tail -14
echo "== tables (total $(now) s)"
cat "$checks"
echo
cat "$breakdown"
echo
cat "$qbreak"
echo
cat "$table"
echo
cat "$abt"
