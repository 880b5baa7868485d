#!/usr/bin/env bash
# Load and quantize at the speed of the disk (issue 20), in one device call: a bf16
# Llama-3-8B-shape GGUF (smelt synth; SmolLM2's tokenizer, so its vocabulary of 49,152:
# 14.8 GB) read by `cat` (page cache warm, and cold when drop_caches works) beside
# `smelt quantize --device cuda` to q6_k and q4_k_m, `smelt run --isq q6_k --device cuda` to its
# first token, the CPU quantizer on all cores, `cmp` of the GPU and CPU outputs; the 8B Q4_K
# file loaded by `smelt run` and by `smelt serve` (to its first answered request, kernel
# caches empty and then warm) beside llama.cpp's load time on the same file; then the
# largest bf16 shape that fits the disk with its output (qwen3-14b, 29.5 GB), GPU and CPU.
#
# Here:  cargo build --release -p smelt && mkdir -p .gpu-load &&
#        strip -o /tmp/smelt target/release/smelt && gzip -9 -c /tmp/smelt > .gpu-load/smelt.gz
#        .gpu-load/tok.gguf: a GGUF holding only SmolLM2's tokenizer (1.8 MB; see the report
#        of issue 20 for the one-off gguf-py snippet; any GGUF with a tokenizer will do)
#        LLAMACPP=1 needs .peer too (../shared/peer/prepare.sh .peer)
# There: bash bench/gpu/load.sh   carry [".gpu-load"] (or [".gpu-load", ".peer"] with LLAMACPP=1)
# Environment: LLAMACPP=1 builds llama.cpp (~3.5 min) for its load time; SKIP="14b cpu ..." skips
# phases (8b cpu serve 14b 14bcpu); BUDGET seconds (default 560) skips what would run past it.
# Log: $OUT/load.log (or bench/out); the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}
mkdir -p "$out"
log="$out/load.log"
table="$out/load-table.md"
S=/tmp/smelt-load
gunzip -c .gpu-load/smelt.gz > $S && chmod +x $S
W=${LOAD_DIR:-/tmp/load}
rm -rf "$W"; mkdir -p "$W"
T0=$EPOCHREALTIME
BUDGET=${BUDGET:-560}
SKIP=" ${SKIP:-} "
export SMELT_CUDA_LOAD_LOG=1
export XDG_CACHE_HOME=$W/cache
: > "$table"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  nproc; free -g | head -2; df -h "$W" | tail -1; } 2>&1 | tee "$log"

now() { awk -v a="$EPOCHREALTIME" -v b="$T0" 'BEGIN { printf "%.0f", a - b }'; }
left() { awk -v a="$EPOCHREALTIME" -v b="$T0" -v c="$BUDGET" 'BEGIN { printf "%.0f", c - (a - b) }'; }
skip() { [[ "$SKIP" == *" $1 "* ]]; }
# secs CMD...: runs CMD (output to the log), prints its wall seconds; rc in $rc.
secs() {
    local s=$EPOCHREALTIME
    echo "\$ $*" >> "$log"
    "$@" >> "$log" 2>&1; rc=$?
    awk -v a="$EPOCHREALTIME" -v b="$s" 'BEGIN { printf "%.2f", a - b }'
    [ $rc = 0 ] || printf " (rc=%s)" $rc
}
row() { echo "| $1 | $2 | $3 |" | tee -a "$log" >> "$table"; }
cold() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx read", a / b; else print "-" }'; }
gbs() { awk -v f="$1" -v t="$2" 'BEGIN { if (t > 0) printf "%.2f GB/s", f / t / 1e9; else print "-" }'; }

if [ "${LLAMACPP:-0}" = 1 ]; then
    echo "== llama.cpp build (before any timing: it takes every core)" | tee -a "$log"
    s=$(secs bash -c 'set -e; d=$PWD/.peer; cd /tmp; tar xzf $d/llcpp.tgz
        python3 -m pip install -q --no-index --no-deps --target /tmp/site $d/*.whl
        CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF" \
        CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install -q --no-build-isolation --no-deps \
            --no-index --target /tmp/site ./llama_cpp_python-*/')
    echo "llama.cpp build: $s s" | tee -a "$log"
fi

ids=$(seq -s, 100 1 116)
# A dry run of this script's logic on a CPU machine: SHAPE8=llama3-tiny SHAPE14=qwen3-tiny DEV=cpu
SHAPE8=${SHAPE8:-llama3-8b}; SHAPE14=${SHAPE14:-qwen3-14b}; DEV=${DEV:-cuda}
if ! skip 8b; then
echo "== 8B bf16" | tee -a "$log"
bf=$W/l8-bf16.gguf
s=$(secs $S synth --shape $SHAPE8 --quant bf16 --tokenizer-from .gpu-load/tok.gguf -o $bf)
size=$(stat -c %s $bf)
echo "synth: $s s, $size bytes" | tee -a "$log"
echo "| what (8B bf16, $(awk -v b=$size 'BEGIN{printf "%.1f GB", b/1e9}')) | seconds | vs read / rate |" >> "$table"
echo "|---|---:|---|" >> "$table"
catw=$(secs cat $bf); catw=$(secs cat $bf)
row "cat > /dev/null (page cache warm)" "$catw" "$(gbs $size $catw)"
cold
if [ "$(awk '/^Cached:/ {print $2}' /proc/meminfo)" -lt 4000000 ]; then
    catc=$(secs cat $bf)
    row "cat > /dev/null (cold: caches dropped)" "$catc" "$(gbs $size $catc)"
    cold
    s=$(secs $S quantize $bf $W/l8-q6k-cold.gguf --type q6_k --device $DEV)
    row "smelt quantize --device $DEV q6_k (cold)" "$s" "$(ratio $s $catc)"
    rm -f $W/l8-q6k-cold.gguf
    cat $bf > /dev/null
else
    row "cold read" "-" "drop_caches not allowed here"
fi
s=$(secs $S quantize $bf $W/l8-q6k-gpu.gguf --type q6_k --device $DEV)
row "smelt quantize --device $DEV q6_k" "$s" "$(ratio $s $catw)"
grep -a "^wrote.*q6_K" "$log" | tail -1
s=$(secs $S quantize $bf $W/l8-q4km-gpu.gguf --type q4_k_m --device $DEV)
row "smelt quantize --device $DEV q4_k_m" "$s" "$(ratio $s $catw)"
s=$(secs $S run --model $bf --isq q6_k --device $DEV --prompt-ids $ids --max-tokens 1 --json)
row "smelt run --isq q6_k --device $DEV, to first token (process wall)" "$s" "$(ratio $s $catw)"
s=$(secs $S run --model $W/l8-q6k-gpu.gguf --device $DEV --prompt-ids $ids --max-tokens 1 --json)
row "smelt run of the q6_k file --device $DEV, to first token" "$s" "-"
# The same weights reached the GPU both ways: the same 8 greedy tokens.
$S run --model $bf --isq q6_k --device $DEV --prompt-ids $ids --max-tokens 8 --json 2>>"$log" | tail -1 | grep -o '"tokens":\[[0-9,]*\]' > $W/isq.tok
$S run --model $W/l8-q6k-gpu.gguf --device $DEV --prompt-ids $ids --max-tokens 8 --json 2>>"$log" | tail -1 | grep -o '"tokens":\[[0-9,]*\]' > $W/file.tok
cat $W/isq.tok $W/file.tok >> "$log"
row "8 greedy tokens, --isq q6_k vs the q6_k file" "-" "$([ -s $W/isq.tok ] && cmp -s $W/isq.tok $W/file.tok && echo SAME || echo DIFFER)"
if ! skip cpu && [ "$(left)" -gt 200 ]; then
    s=$(secs $S quantize $bf $W/l8-q6k-cpu.gguf --type q6_k)
    row "smelt quantize --device cpu q6_k ($(nproc) cores)" "$s" "$(ratio $s $catw)"
    row "cmp q6_k GPU vs CPU" "-" "$(cmp $W/l8-q6k-gpu.gguf $W/l8-q6k-cpu.gguf >> "$log" 2>&1 && echo SAME || echo DIFFER)"
    rm -f $W/l8-q6k-cpu.gguf
    s=$(secs $S quantize $bf $W/l8-q4km-cpu.gguf --type q4_k_m)
    row "smelt quantize --device cpu q4_k_m" "$s" "$(ratio $s $catw)"
    row "cmp q4_k_m GPU vs CPU" "-" "$(cmp $W/l8-q4km-gpu.gguf $W/l8-q4km-cpu.gguf >> "$log" 2>&1 && echo SAME || echo DIFFER)"
    rm -f $W/l8-q4km-cpu.gguf
else
    row "CPU quantizer (8B)" "-" "skipped"
fi
rm -f $W/l8-q6k-gpu.gguf $W/l8-q4km-gpu.gguf $bf
fi

if ! skip serve; then
    echo "== 8B Q4_K: plain loads, serve cold start" | tee -a "$log"
    q4=$W/l8-q4k.gguf
    $S synth --shape $SHAPE8 --quant q4_k --tokenizer-from .gpu-load/tok.gguf -o $q4 2>&1 | tail -1 | tee -a "$log"
    q4size=$(stat -c %s $q4)
    echo "| what (8B Q4_K, $(awk -v b=$q4size 'BEGIN{printf "%.2f GB", b/1e9}')) | seconds | note |" >> "$table"
    echo "|---|---:|---|" >> "$table"
    catq=$(secs cat $q4)
    row "cat > /dev/null (warm)" "$catq" "$(gbs $q4size $catq)"
    serve_first() { # prints seconds from launch to the first answered completion
        python3 - "$S" "$q4" "$1" "$DEV" <<'PY'
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
        cat /tmp/serve-load.err >> "$log"
    }
    rm -rf "$XDG_CACHE_HOME" ~/.nv/ComputeCache
    s=$(serve_first 8391)
    row "smelt serve --device $DEV: launch to first answer (no kernel cache)" "$s" "$(ratio $s $catq)"
    s=$(serve_first 8392)
    row "smelt serve --device $DEV: launch to first answer (caches warm)" "$s" "$(ratio $s $catq)"
    grep -a "kernels:" "$log" | tail -3
    s=$(secs $S run --model $q4 --device $DEV --prompt-ids $ids --max-tokens 1 --json)
    row "smelt run --device $DEV, to first token" "$s" "$(ratio $s $catq)"
    if [ "${LLAMACPP:-0}" = 1 ]; then
        r=$(PYTHONPATH=/tmp/site python3 - "$q4" <<'PY' 2>>"$log"
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
)
        row "llama.cpp llama_model_load_from_file (all layers on the GPU)" "${r%% *}" "$(ratio ${r%% *} $catq)"
        row "llama.cpp import + load + context + first decode" "${r##* }" "$(ratio ${r##* } $catq)"
    fi
    rm -f $q4
fi

if ! skip 14b && [ "$(left)" -gt 150 ]; then
    echo "== 14B bf16" | tee -a "$log"
    b14=$W/q14-bf16.gguf
    s=$(secs $S synth --shape $SHAPE14 --quant bf16 --tokenizer-from .gpu-load/tok.gguf -o $b14)
    size=$(stat -c %s $b14)
    echo "synth 14b: $s s, $size bytes; $(df -h $W | tail -1)" | tee -a "$log"
    echo "| what (qwen3-14b bf16, $(awk -v b=$size 'BEGIN{printf "%.1f GB", b/1e9}')) | seconds | vs read |" >> "$table"
    echo "|---|---:|---|" >> "$table"
    cat $b14 > /dev/null
    c14=$(secs cat $b14)
    row "cat > /dev/null (warm)" "$c14" "$(gbs $size $c14)"
    s=$(secs $S quantize $b14 $W/q14-q6k-gpu.gguf --type q6_k --device $DEV)
    row "smelt quantize --device $DEV q6_k" "$s" "$(ratio $s $c14)"
    s=$(secs $S run --model $b14 --isq q6_k --device $DEV --prompt-ids $ids --max-tokens 1 --json)
    row "smelt run --isq q6_k --device $DEV, to first token" "$s" "$(ratio $s $c14)"
    if ! skip 14bcpu && [ "$(left)" -gt 130 ]; then
        s=$(secs $S quantize $b14 $W/q14-q6k-cpu.gguf --type q6_k)
        row "smelt quantize --device cpu q6_k ($(nproc) cores)" "$s" "$(ratio $s $c14)"
        row "cmp q6_k GPU vs CPU" "-" "$(cmp $W/q14-q6k-gpu.gguf $W/q14-q6k-cpu.gguf >> "$log" 2>&1 && echo SAME || echo DIFFER)"
        rm -f $W/q14-q6k-cpu.gguf
    else
        row "CPU quantizer (14B)" "-" "skipped (time)"
    fi
    rm -f $W/q14-q6k-gpu.gguf
    rm -f $b14
else
    echo "| 14B | - | skipped |" >> "$table"
fi
grep -ah "^wrote\|quantized to\|kernels:" "$log" | tail -20
echo "== table (total $(now) s)" | tee -a "$log"
tee -a "$log" < "$table"
