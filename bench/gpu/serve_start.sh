#!/usr/bin/env bash
# Where `smelt serve --device cuda`'s start goes (issue 20's start-up row): launch to the
# first answered request on a Llama-3-8B-shape Q4_K (SmolLM2's tokenizer) with the load log
# on (SMELT_CUDA_LOAD_LOG=1: device + kernels, weights, KV cache), beside `smelt run` to 8
# tokens on the same file, for this tree's binary and an older one (.gpu-serve/smelt-old.gz,
# optional), the old one's serve also with glibc's one arena (MALLOC_ARENA_MAX=1).
# The first command compiles the kernel cache (about a minute on a fresh machine).
# Here:  as bench/gpu/serve.sh (.gpu-serve: smelt.gz, tok.gguf)
# There: bash bench/gpu/serve_start.sh    carry [".gpu-serve"]    (~1 minute)
# Log: $OUT/serve_start.log; the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/out}; mkdir -p "$out"; log="$out/serve_start.log"
S=/tmp/smelt; gunzip -c .gpu-serve/smelt.gz > $S && chmod +x $S
m=/tmp/serve-llama3-8b-q4_k.gguf
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; } | tee "$log"
$S synth --shape llama3-8b --quant q4_k --tokenizer-from .gpu-serve/tok.gguf -o $m 2>&1 | tail -1 | tee -a "$log"
cat $m > /dev/null
table=/tmp/serve-start.md
printf '| command | launch to first answer or 8 tokens (s; run: token digest) | load log |\n|---|---:|---|\n' > $table
first() { # flags...: seconds from launch to the first answered completion
    SMELT_CUDA_LOAD_LOG=1 timeout 150 python3 - "$S" "$m" "$@" 2>>"$log" <<'PY'
import json, subprocess, sys, time, urllib.request
smelt, model, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
t0 = time.perf_counter()
p = subprocess.Popen([smelt, "serve", "-m", model, "--device", "cuda", "--port", "8397", *flags],
                     stdout=subprocess.DEVNULL, stderr=open("/tmp/serve-start.err", "w"))
ok, body = None, None
while time.perf_counter() - t0 < 120 and p.poll() is None:
    try:
        if body is None:
            m = json.load(urllib.request.urlopen("http://127.0.0.1:8397/v1/models", timeout=5))
            body = json.dumps({"model": m["data"][0]["id"], "prompt": "Hello", "max_tokens": 1}).encode()
        r = urllib.request.urlopen(urllib.request.Request(
            "http://127.0.0.1:8397/v1/completions", body, {"Content-Type": "application/json"}), timeout=30)
        if r.status == 200:
            ok = time.perf_counter() - t0
            break
    except Exception:
        time.sleep(0.02)
p.terminate(); p.wait()
print(f"{ok:.2f}" if ok else "FAIL")
PY
}
# `smelt run` beside `smelt serve` on the same file (the 2026-11-28 03:40 run: serve's weights
# took 2.4-2.8 s where run's took 0.58 s), with .gpu-serve/smelt-old.gz (the build before the
# reused repack buffer) beside this tree's, and the old one with MALLOC_ARENA_MAX=1 (glibc's
# one arena: a loader thread's matrices in the main heap, so the cause shows).
S0=$S; [ -s .gpu-serve/smelt-old.gz ] && { S0=/tmp/smelt-old; gunzip -c .gpu-serve/smelt-old.gz > $S0 && chmod +x $S0; }
for r in 1 2; do
  for f in run run-old serve serve-old serve-old-arena1; do
    b=$S; [ "${f%-old*}" != "$f" ] && b=$S0
    case $f in
      run*)
        s0=$EPOCHREALTIME
        SMELT_CUDA_LOAD_LOG=1 timeout 120 $b run --model $m --device cuda --prompt-ids 100,101,102 --max-tokens 8 --json 2> /tmp/serve-start.err | tail -1 | grep -o '"tokens":\[[0-9,]*\]' > /tmp/tok-$f
        s="$(awk -v a="$EPOCHREALTIME" -v b="$s0" 'BEGIN { printf "%.2f", a - b }') $(md5sum < /tmp/tok-$f | cut -c1-8)";;
      *arena1) s=$(MALLOC_ARENA_MAX=1 S=$b first);;
      *) s=$(S=$b first);;
    esac
    { echo "== $f (round $r): $s s"; cat /tmp/serve-start.err; } >> "$log"
    l=$(grep -aE "load:|weights to" /tmp/serve-start.err | cut -c1-160 | tr '\n' ' ')
    echo "| $f (round $r) | $s | $l |" >> $table
  done
done
cat $table | tee -a "$log"
