#!/usr/bin/env bash
# Load and quantize at the speed of the disk (issue 20), in one device call: a bf16
# Llama-3-8B-shape GGUF (smelt synth; SmolLM2's tokenizer, so its vocabulary of 49,152:
# 14.8 GB) read by `cat` (page cache warm, and cold when drop_caches works) beside
# `smelt quantize --device cuda` to q6_k and q4_k_m, `smelt run --isq q6_k --device cuda` to its
# first token, the CPU quantizer on all cores and `cmp` of the GPU and CPU outputs; the 8B Q4_K
# file loaded by `smelt run` (staged uploads vs the serial path they replaced: same tokens)
# and by `smelt serve` to its first answered request (kernel caches empty, then warm).
# Optional: llama.cpp's load time on the same Q4_K file (LLAMACPP=1, builds it: ~3.5 min) and
# the largest bf16 shape that fits the disk with its output (BIG=1: qwen3-14b, ~28 GB).
#
# Here:  cargo build --release -p smelt && mkdir -p .gpu-load &&
#        strip -o /tmp/smelt target/release/smelt && gzip -9 -c /tmp/smelt > .gpu-load/smelt.gz
#        .gpu-load/tok.gguf: a GGUF holding only SmolLM2's tokenizer (1.8 MB; any GGUF with a
#        tokenizer will do). LLAMACPP=1 needs .peer too (../shared/peer/prepare.sh .peer).
# There: bash bench/gpu/load.sh   carry [".gpu-load"] (with LLAMACPP=1: [".gpu-load", ".peer"])
# Environment: BUDGET seconds (default 330): optional phases start only with time left, and
# every command has a hard timeout. A dry run of the logic on a CPU machine:
#   SHAPE8=llama3-tiny SHAPE14=qwen3-tiny DEV=cpu bash bench/gpu/load.sh
# Output: the table rows on stdout as they come and the table last; details in $OUT/load.log
# (or bench/out), which holds only stderr lines of the commands (no data).
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
BUDGET=${BUDGET:-330}
SHAPE8=${SHAPE8:-llama3-8b}; SHAPE14=${SHAPE14:-qwen3-14b}; DEV=${DEV:-cuda}
export SMELT_CUDA_LOAD_LOG=1
export XDG_CACHE_HOME=$W/cache
: > "$table"
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
# tokens FILE CMD...: runs CMD (a `smelt run --json`), keeps its generated tokens in FILE,
# prints its wall seconds.
tokens() {
    local f=$1 s=$EPOCHREALTIME rc; shift
    echo "\$ $*" >> "$log"
    timeout 150 "$@" 2>> "$log" | tail -1 | grep -o '"tokens":\[[0-9,]*\]' > "$f"; rc=${PIPESTATUS[0]}
    cat "$f" >> "$log"
    awk -v a="$EPOCHREALTIME" -v b="$s" 'BEGIN { printf "%.2f", a - b }'
    [ $rc = 0 ] || printf " (rc=%s)" $rc
}
same() { [ -s "$1" ] && cmp -s "$1" "$2" && echo SAME || echo DIFFER; }
row() { echo "| $1 | $2 | $3 |" | tee -a "$log" "$table"; }
head2() { printf '| %s | seconds | %s |\n|---|---:|---|\n' "$1" "$2" | tee -a "$log" "$table"; }
cold() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; }
ratio() { awk -v a="${1%% *}" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx read", a / b; else print "-" }'; }
gbs() { awk -v f="$1" -v t="${2%% *}" 'BEGIN { if (t > 0) printf "%.2f GB/s", f / t / 1e9; else print "-" }'; }
gb() { awk -v b="$(stat -c %s "$1" 2>/dev/null || echo 0)" 'BEGIN { printf "%.2f GB", b / 1e9 }'; }
catn() { cat "$1" > /dev/null; }
last_wrote() { grep -a "^wrote" "$log" | tail -1 | sed 's/.*; read/read/'; }

if [ "${LLAMACPP:-0}" = 1 ]; then
    echo "== llama.cpp build (before any timing: it takes every core)" | tee -a "$log"
    s=$(secs -t 300 bash -c 'set -e; d=$PWD/.peer; cd /tmp; tar xzf $d/llcpp.tgz
        python3 -m pip install -q --no-index --no-deps --target /tmp/site $d/*.whl
        CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF" \
        CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install -q --no-build-isolation --no-deps \
            --no-index --target /tmp/site ./llama_cpp_python-*/')
    echo "llama.cpp build: $s s" | tee -a "$log"
fi

ids=$(seq -s, 100 1 116)
echo "== 8B bf16 ($(now) s)" | tee -a "$log"
bf=$W/l8-bf16.gguf
s=$(secs -t 120 $S synth --shape $SHAPE8 --quant bf16 --tokenizer-from .gpu-load/tok.gguf -o $bf)
size=$(stat -c %s $bf 2>/dev/null || echo 0)
echo "synth: $s s, $size bytes; $(df -h $W | tail -1)" | tee -a "$log"
head2 "8B bf16, $(gb $bf)" "vs read / rate"
catn $bf
catw=$(secs cat $bf)
row "cat > /dev/null (page cache warm)" "$catw" "$(gbs $size $catw)"
s=$(secs $S quantize $bf $W/l8-q6k-gpu.gguf --type q6_k --device $DEV)
row "smelt quantize --device $DEV q6_k -> $(gb $W/l8-q6k-gpu.gguf)" "$s" "$(ratio "$s" $catw); $(last_wrote)"
s=$(secs $S quantize $bf $W/l8-q4km-gpu.gguf --type q4_k_m --device $DEV)
row "smelt quantize --device $DEV q4_k_m -> $(gb $W/l8-q4km-gpu.gguf)" "$s" "$(ratio "$s" $catw); $(last_wrote)"
rm -f $W/l8-q4km-gpu.gguf
s=$(tokens $W/isq.tok $S run --model $bf --isq q6_k --device $DEV --prompt-ids $ids --max-tokens 8 --json)
row "smelt run --isq q6_k --device $DEV: launch to 8 tokens" "$s" "$(ratio "$s" $catw)"
s=$(tokens $W/file.tok $S run --model $W/l8-q6k-gpu.gguf --device $DEV --prompt-ids $ids --max-tokens 8 --json)
row "smelt run of the q6_k file --device $DEV: launch to 8 tokens" "$s" "tokens vs --isq: $(same $W/isq.tok $W/file.tok)"

echo "== 8B Q4_K: plain loads, serve cold start ($(now) s)" | tee -a "$log"
q4=$W/l8-q4k.gguf
secs -t 120 $S synth --shape $SHAPE8 --quant q4_k --tokenizer-from .gpu-load/tok.gguf -o $q4 > /dev/null
q4size=$(stat -c %s $q4 2>/dev/null || echo 0)
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
rm -rf "$XDG_CACHE_HOME" ~/.nv/ComputeCache
s=$(serve_first 8391)
row "smelt serve --device $DEV: launch to first answer (no kernel cache)" "$s" "$(ratio "$s" $catq)"
s=$(serve_first 8392)
row "smelt serve --device $DEV: launch to first answer (caches warm)" "$s" "$(ratio "$s" $catq)"
s=$(tokens $W/new.tok $S run --model $q4 --device $DEV --prompt-ids $ids --max-tokens 8 --json)
row "smelt run --device $DEV: launch to 8 tokens" "$s" "$(ratio "$s" $catq)"
s=$(SMELT_CUDA_UPLOAD=plain tokens $W/old.tok $S run --model $q4 --device $DEV --prompt-ids $ids --max-tokens 8 --json)
row "same, serial upload (SMELT_CUDA_UPLOAD=plain: before)" "$s" "tokens vs staged: $(same $W/new.tok $W/old.tok)"
if [ "${LLAMACPP:-0}" = 1 ]; then
    r=$(PYTHONPATH=/tmp/site timeout 120 python3 - "$q4" 2>>"$log" <<'PY'
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
    row "llama.cpp llama_model_load_from_file (all layers on the GPU)" "${r%% *}" "$(ratio "${r%% *}" $catq)"
    row "llama.cpp import + load + context + first decode" "${r##* }" "$(ratio "${r##* }" $catq)"
fi
rm -f $q4

echo "== CPU quantizer, cold reads ($(now) s)" | tee -a "$log"
head2 "8B bf16 again" "note"
if [ "$(left)" -gt 110 ]; then
    s=$(secs -t 100 $S quantize $bf $W/l8-q6k-cpu.gguf --type q6_k)
    row "smelt quantize --device cpu q6_k ($(nproc) cores)" "$s" "$(ratio "$s" $catw); $(last_wrote)"
    row "cmp q6_k: GPU file vs CPU file" "-" "$(cmp $W/l8-q6k-gpu.gguf $W/l8-q6k-cpu.gguf >> "$log" 2>&1 && echo SAME || echo DIFFER)"
    rm -f $W/l8-q6k-cpu.gguf
else
    row "CPU quantizer" "-" "skipped (time)"
fi
rm -f $W/l8-q6k-gpu.gguf
if [ "$(left)" -gt 50 ]; then
    cold
    if [ "$(awk '/^Cached:/ {print $2}' /proc/meminfo)" -lt 4000000 ]; then
        catc=$(secs cat $bf)
        row "cat > /dev/null (cold: caches dropped)" "$catc" "$(gbs $size $catc)"
        cold
        s=$(secs -t 60 $S quantize $bf $W/l8-q6k-cold.gguf --type q6_k --device $DEV)
        row "smelt quantize --device $DEV q6_k (cold)" "$s" "$(ratio "$s" $catc); $(last_wrote)"
        rm -f $W/l8-q6k-cold.gguf
    else
        row "cold read" "-" "drop_caches not allowed here"
    fi
fi
if [ "$(left)" -gt 100 ]; then
    $S quantize $bf $W/l8-q4km-gpu.gguf --type q4_k_m --device $DEV > /dev/null 2>> "$log"
    s=$(secs -t 120 $S quantize $bf $W/l8-q4km-cpu.gguf --type q4_k_m)
    row "smelt quantize --device cpu q4_k_m" "$s" "$(ratio "$s" $catw); $(last_wrote)"
    row "cmp q4_k_m: GPU file vs CPU file" "-" "$(cmp $W/l8-q4km-gpu.gguf $W/l8-q4km-cpu.gguf >> "$log" 2>&1 && echo SAME || echo DIFFER)"
    rm -f $W/l8-q4km-cpu.gguf $W/l8-q4km-gpu.gguf
fi
rm -f $bf

if [ "${BIG:-0}" = 1 ] && [ "$(left)" -gt 150 ]; then
    echo "== 14B bf16 ($(now) s)" | tee -a "$log"
    b14=$W/q14-bf16.gguf
    s=$(secs -t 150 $S synth --shape $SHAPE14 --quant bf16 --tokenizer-from .gpu-load/tok.gguf -o $b14)
    size=$(stat -c %s $b14 2>/dev/null || echo 0)
    head2 "qwen3-14b bf16, $(gb $b14)" "vs read"
    catn $b14
    c14=$(secs cat $b14)
    row "cat > /dev/null (warm)" "$c14" "$(gbs $size $c14)"
    s=$(secs $S quantize $b14 $W/q14-q6k-gpu.gguf --type q6_k --device $DEV)
    row "smelt quantize --device $DEV q6_k" "$s" "$(ratio "$s" $c14); $(last_wrote)"
    if [ "$(left)" -gt 130 ]; then
        s=$(secs -t 200 $S quantize $b14 $W/q14-q6k-cpu.gguf --type q6_k)
        row "smelt quantize --device cpu q6_k ($(nproc) cores)" "$s" "$(ratio "$s" $c14); $(last_wrote)"
        row "cmp q6_k GPU vs CPU" "-" "$(cmp $W/q14-q6k-gpu.gguf $W/q14-q6k-cpu.gguf >> "$log" 2>&1 && echo SAME || echo DIFFER)"
    fi
    rm -f $W/q14-q6k-gpu.gguf $W/q14-q6k-cpu.gguf $b14
fi
echo "== kernel loads and summaries" | tee -a "$log"
grep -ah "kernels:\|quantized to\|^wrote\|weights to" "$log" | cut -c1-220 | tail -16
echo "== table (total $(now) s)"
cat "$table"
