#!/usr/bin/env bash
# The CPU engine's llama.cpp oracle tests and its issue-3 speed table (smelt vs llama.cpp,
# pp512/tg128, 2 threads) on the GPU machine's HOST CPU, for when the development machine has
# no AVX-512: the oracle is llama.cpp's AVX-512 build (scripts/oracles.sh), the bits the CPU
# engine reproduces, and it dies with SIGILL on an AVX2-only CPU.
#
# One device call carries at most 64 MiB and that machine has no network, so the kit (slimmed
# llama-cpp-python sdist, gguf/diskcache wheels, the stripped test binaries and smelt) and
# the two models travel in pieces over back-to-back calls, kept on the machine while it stays
# warm (30 s idle), as bench/gpu/parity.sh does. The first call that brings the kit starts
# building llama-cpp-python in the background (setsid: it outlives the call), so the build
# overlaps the model transfers.
#
# Here (after the tree to test is committed; notes the commit and any dirty files):
#   bench/engine/device_cpu.sh split
#     builds the test binaries whose oracle answers are recorded (smelt-engine llama_cpp,
#     llama_layers, ggml_kernels; smelt run, perplexity, synth_arch) and smelt, packs the kit into .gpu-h6-1 and the models (SmolLM2 first) into
#     .gpu-h6-1 .. .gpu-h6-N (PIECE_MIB, default 51 MiB: 59 overflowed the 64 MiB call with the 5.5 MB tree), each with a MANIFEST.
# There, N calls back to back (device tool, kind nvidia-h200 or nvidia-h100-x1):
#   command "bash bench/engine/device_cpu.sh run", carry [".gpu-h6-K"], K = 1..N in order.
# Each call stores what it carried in $H6_STORE (default /root/h6store); the call that
# completes the set waits for the oracle build, runs the oracle tests (logs $OUT/test-*.log,
# pass/fail per test; SMELT_ORACLE_RECORD=1, so the oracle's answers come back in
# $OUT/records.tgz: unpack it into crates/smelt-oracle/records/ and commit) and then the speed table on two CPUs (taskset, both engines, same
# prompt ids, best of REPS=3, alternating), table last ($OUT/speed.log).
# Environment there: H6_ONLY=tests|speed (one phase), REPS, TEST_TIMEOUT (s per binary, 240).
# Diagnosis of the oracle crash (one call, carry [".gpu-h6-1"]): bash bench/engine/device_cpu.sh diag
set -euo pipefail
cd "$(dirname "$0")/../.."
models=(SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf)
# The oracle's build, as scripts/oracles.sh (GGML_NATIVE off, AVX-512 on, AMX off); the
# llama.cpp tools/examples/tests are not built (they change no library bit, only build time).
# The GPU image sets CC/CXX to a newer GCC under /opt/gcc whose libstdc++ is not the one loaded
# at run time: llama.cpp's std::regex (BPE vocabularies) then crashes in a mismatched symbol
# (codecvt::do_unshift from _BracketMatcher::_M_ready, 2026-11-25). Build with the system's.
[ -x /usr/bin/g++ ] && export CC=/usr/bin/gcc CXX=/usr/bin/g++
oracle_cmake="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF"

# Executable paths of the test binaries that `cargo test --no-run` builds, from its JSON.
test_exes() {
  cargo test --release --no-run --message-format=json "$@" 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    try: m = json.loads(l)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["manifest_path"].split("/")[-2], m["target"]["name"], m["executable"])'
}

case "${1:-}" in
  split)
    for m in "${models[@]}"; do [ -s ".models/$m" ] || { echo "missing .models/$m: scripts/fetch-models.sh all" >&2; exit 1; }; done
    [ -s .peer/llcpp.tgz ] || { echo "missing .peer/llcpp.tgz: ../shared/peer/prepare.sh .peer" >&2; exit 1; }
    cargo test --release --no-run -p smelt-engine --test llama_cpp --test llama_layers --test ggml_kernels
    cargo test --release --no-run -p smelt --test run --test perplexity --test synth_arch
    cargo build --release -p smelt
    stage=$(mktemp -d)
    kit=$stage/kit
    mkdir -p "$kit/bin"
    { test_exes -p smelt-engine --test llama_cpp --test llama_layers --test ggml_kernels
      test_exes -p smelt --test run --test perplexity --test synth_arch; } > "$stage/exes"
    [ "$(wc -l < "$stage/exes")" -eq 6 ] || { cat "$stage/exes"; echo "expected 6 test binaries" >&2; exit 1; }
    while read -r crate name exe; do
      strip -o "$kit/bin/$crate.$name" "$exe"
    done < "$stage/exes"
    strip -o "$kit/bin/smelt" "${CARGO_TARGET_DIR:-target}/release/smelt"
    # The sdist without its git history, the web UI and the GPU backends' sources (none of
    # them is compiled in a CPU build): 49 -> ~10 MiB.
    mkdir -p "$stage/src"
    tar -xzf .peer/llcpp.tgz -C "$stage/src"
    src=$(ls -d "$stage"/src/llama_cpp_python-*)
    rm -rf "$src"/.git "$src"/.github "$src"/docs "$src"/examples "$src"/docker \
      "$src"/vendor/llama.cpp/.github "$src"/vendor/llama.cpp/.git "$src"/vendor/llama.cpp/tools/ui \
      "$src"/vendor/llama.cpp/tests "$src"/vendor/llama.cpp/examples
    for b in cuda vulkan sycl opencl hexagon metal et openvino webgpu cann virtgpu musa hip zdnn zendnn; do
      rm -rf "$src/vendor/llama.cpp/ggml/src/ggml-$b"
    done
    tar -czf "$kit/llcpp-slim.tgz" -C "$stage/src" "$(basename "$src")"
    cp .peer/gguf-*.whl .peer/diskcache-*.whl "$kit/"
    { echo "commit $(git rev-parse HEAD)"; echo "built $(date -u '+%Y-%m-%d %H:%M UTC')"
      git status --short --untracked-files=no | sed 's/^/dirty /'; } > "$kit/BUILD"
    (cd "$kit" && sha256sum bin/* > BIN.sha256)
    tar -czf "$stage/kit.tar" -C "$stage" kit  # gzipped: the binaries shrink ~3x
    tar -cf "$stage/models.tar" -C .models "${models[@]}"
    piece=$(( ${PIECE_MIB:-51} * 1024 * 1024 ))
    kitsz=$(stat -c %s "$stage/kit.tar")
    first=$(( piece - kitsz ))
    [ $first -gt 0 ] || { echo "the kit ($kitsz bytes) fills a whole piece" >&2; exit 1; }
    # Piece 1: the kit plus the models' first bytes; then whole pieces.
    total=$(stat -c %s "$stage/models.tar")
    head -c $first "$stage/models.tar" > "$stage/models.tar.part00"
    tail -c +$((first + 1)) "$stage/models.tar" | split -b $piece -d -a 2 --numeric-suffixes=1 - "$stage/models.tar.part"
    (cd "$stage" && sha256sum kit.tar models.tar.part*) > "$stage/MANIFEST"
    (cd .models && sha256sum "${models[@]}") >> "$stage/MANIFEST"
    echo "models.tar $total" >> "$stage/MANIFEST"
    rm -rf .gpu-h6-[0-9]*
    i=0
    for p in "$stage"/models.tar.part*; do
      i=$((i + 1)); mkdir -p .gpu-h6-$i; mv "$p" .gpu-h6-$i/; cp "$stage/MANIFEST" .gpu-h6-$i/
    done
    mv "$stage/kit.tar" .gpu-h6-1/
    cat "$kit/BUILD"
    rm -rf "$stage"
    du -sh .gpu-h6-[0-9]*
    echo "calls (back to back): command 'bash bench/engine/device_cpu.sh run', carry:"
    for k in $(seq 1 $i); do echo "  [\".gpu-h6-$k\"]"; done
    ;;
  run)
    store=${H6_STORE:-/root/h6store}
    out=${OUT:-bench/out}
    mkdir -p "$store/ok" "$out"
    log=$out/device_cpu.log
    t0=$SECONDS
    repo=$(pwd)
    for d in .gpu-h6-[0-9]*; do [ -d "$d" ] && cp -f "$d"/* "$store"/; done
    if [ ! -e "$store/ok/probe" ]; then
      { date -u; echo "pwd $repo"; nproc; lscpu | grep -E "Model name|Socket|Core|Thread|NUMA node|L2|L3" | cut -c1-200
        echo "avx512: $(grep -o 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
        echo "cpu0 siblings: $(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list 2>/dev/null)"
        python3 -V; command -v python3; gcc --version | head -1; cmake --version | head -1
        env | grep -E '^(C|CXX|LD|CPP)FLAGS=|^CMAKE|^LD_|^CC=|^CXX=' || echo "no compiler/linker flags in the environment"
        python3 -c 'import numpy, scikit_build_core, jinja2, typing_extensions; print("numpy", numpy.__version__, "skbuild", scikit_build_core.__version__)' || echo "python3 lacks a build need (numpy/scikit-build-core/jinja2)"
      } 2>&1 | tee "$out/probe.log"
      touch "$store/ok/probe"
    fi
    cd "$store"
    missing=0
    while read -r sum name; do
      case "$name" in
        kit.tar|models.tar.part*)
          if [ ! -s "$name" ]; then echo "missing $name" | tee -a "$log"; missing=$((missing + 1))
          elif [ "$(cat "ok/$name" 2>/dev/null)" != "$sum" ]; then
            if [ "$(sha256sum "$name" | cut -d' ' -f1)" != "$sum" ]; then
              echo "BAD $name (sha256 differs): removed" | tee -a "$log"; rm -f "$name"; missing=$((missing + 1))
            else echo "$sum" > "ok/$name"; echo "ok $name" | tee -a "$log"; fi
          fi ;;
      esac
    done < MANIFEST
    kitsum=$(grep ' kit.tar$' MANIFEST | cut -d' ' -f1)
    if [ "$(cat ok/kit.tar 2>/dev/null)" = "$kitsum" ] && [ "$(cat ok/kit.extracted 2>/dev/null)" != "$kitsum" ]; then
      rm -rf kit && tar -xzf kit.tar && echo "$kitsum" > ok/kit.extracted
    fi
    if [ -e ok/kit.extracted ] && [ ! -e ok/build.started ]; then
      touch ok/build.started
      # The oracle build outlives this call (setsid: its own session); build.rc marks its end.
      setsid nohup bash -c "
        ( set -e; rm -rf /tmp/h6build; mkdir -p /tmp/h6build /tmp/site; cd /tmp/h6build
          tar -xzf '$store/kit/llcpp-slim.tgz'
          python3 -m pip install -q --no-index --no-deps --target /tmp/site '$store'/kit/*.whl
          start=\$(date +%s)
          CMAKE_ARGS='$oracle_cmake' CMAKE_BUILD_PARALLEL_LEVEL=\$(nproc) \
            python3 -m pip install -q --no-build-isolation --no-deps --no-index --target /tmp/site ./llama_cpp_python-*/
          echo \"build took \$((\$(date +%s) - start)) s\" )
        echo \$? > '$store/build.rc'
      " > "$store/build.log" 2>&1 < /dev/null &
      echo "oracle build started in the background" | tee -a "$log"
    fi
    echo "== build: $(tail -n 3 build.log 2>/dev/null | tr '\n' ' ') rc=$(cat build.rc 2>/dev/null || echo running)" | tee -a "$log"
    if [ $missing -gt 0 ]; then
      echo "== $missing piece(s) still missing ($((SECONDS - t0)) s)" | tee -a "$log"
      exit 0
    fi
    mkdir -p models
    for m in "${models[@]}"; do
      want=$(grep " $m\$" MANIFEST | cut -d' ' -f1)
      if [ ! -s "models/$m" ] || [ "$(sha256sum "models/$m" | cut -d' ' -f1)" != "$want" ]; then
        cat models.tar.part* | tar -xf - -C models
        got=$(sha256sum "models/$m" | cut -d' ' -f1)
        [ "$got" = "$want" ] || { echo "reassembled $m: sha256 $got != $want" | tee -a "$log"; exit 1; }
      fi
    done
    echo "== models in place, sha256 equal to the originals ($((SECONDS - t0)) s)" | tee -a "$log"
    tee -a "$log" < kit/BUILD
    (cd kit && sha256sum -c --quiet BIN.sha256) || { echo "binaries damaged" | tee -a "$log"; exit 1; }
    # The tests find the repo (oracle scripts, .models, CARGO_BIN_EXE_smelt) through the
    # compiled-in /work/main paths.
    if [ "$repo" != /work/main ] && [ ! -e /work/main ]; then mkdir -p /work && ln -s "$repo" /work/main; fi
    [ -e /work/main/.models ] || ln -s "$store/models" /work/main/.models
    # (A smelt already there is someone's build: a test of this checkout itself, left alone.)
    if [ ! -e /work/main/target/release/smelt ] || [ -e ok/smelt.placed ]; then
      mkdir -p /work/main/target/release
      cp -f kit/bin/smelt /work/main/target/release/smelt && touch ok/smelt.placed
    fi
    for _ in $(seq 1 100); do [ -e build.rc ] && break; sleep 3; done
    echo "== build: $(tail -n 3 build.log | tr '\n' ' ') rc=$(cat build.rc 2>/dev/null || echo running)" | tee -a "$log"
    [ "$(cat build.rc 2>/dev/null)" = 0 ] || { tail -n 40 build.log; exit 1; }
    printf '#!/bin/sh\nexport PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}\nexec %s "$@"\n' "$(command -v python3)" > /tmp/h6py
    chmod +x /tmp/h6py
    export SMELT_PYTHON=/tmp/h6py SMELT_MODELS=$store/models
    /tmp/h6py -c 'import llama_cpp; print("llama_cpp", llama_cpp.__version__, llama_cpp.__file__)' | tee -a "$log"
    status=0
    if [ "${H6_ONLY:-}" != speed ]; then
      # The oracle's answers are recorded (smelt_oracle::run_recorded) into the tree's
      # crates/smelt-oracle/records/ and come back in $OUT/records for CPUs without AVX-512.
      export SMELT_ORACLE_RECORD=1
      rm -f summary
      for b in kit/bin/smelt-engine.* kit/bin/smelt.*; do
        n=$(basename "$b")
        ( cd /work/main; rc=0; timeout "${TEST_TIMEOUT:-240}" "$store/$b" --test-threads 2 > "$out/test-$n.log" 2>&1 || rc=$?
          echo $rc > "$store/$n.rc" ) &
      done
      wait
      echo "== oracle tests ($((SECONDS - t0)) s)" | tee -a "$log"
      # One archive: the device tool brings back only a few files per call.
      tar -czf "$out/records.tgz" -C /work/main/crates/smelt-oracle/records .
      echo "== $(ls /work/main/crates/smelt-oracle/records | wc -l) oracle records in \$OUT/records.tgz" | tee -a "$log"
      for b in kit/bin/smelt-engine.* kit/bin/smelt.*; do
        n=$(basename "$b"); rc=$(cat "$n.rc")
        [ "$rc" = 0 ] || status=1
        echo "$n rc=$rc: $(grep -E '^test result' "$out/test-$n.log" | head -1 || true)" | tee -a "$log" summary
        { grep -E '^test .* \.\.\. ' "$out/test-$n.log" || true; } | sed 's/^/  /' | tee -a "$log"
      done
    fi
    if [ "${H6_ONLY:-}" != tests ]; then
      # Two CPUs of different cores where the topology tells, both engines pinned to them.
      cpus=$(python3 -c '
import os
def parse(s):
    out = set()
    for part in s.strip().split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out
try:
    sib = parse(open("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list").read())
except OSError:
    sib = {0}
print("0,%d" % next((c for c in sorted(os.sched_getaffinity(0)) if c not in sib), 1))')
      reps=${REPS:-3}
      smelt=/work/main/target/release/smelt
      rows=()
      echo "== speed: taskset -c $cpus, 2 threads, best of $reps, $(date -u '+%H:%M:%S UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log" "$out/speed.log"
      for m in "${models[@]}"; do
        ids=/tmp/h6ids.$m
        # A 512-token prompt: the perplexity text, tokenized by llama.cpp (as bench/engine/cpu.sh).
        /tmp/h6py -c '
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
ids = llm.tokenize(open(sys.argv[2], "rb").read(), add_bos=True, special=False)[: int(sys.argv[3])]
print(",".join(map(str, ids)))' "models/$m" /work/main/crates/smelt/tests/data/perplexity.txt 512 > "$ids" 2>>"$out/speed.err" \
          || { echo "$m: llama.cpp could not tokenize the prompt" | tee -a "$out/speed.log"; continue; }
        sp=0; st=0; lp=0; lt=0
        for r in $(seq "$reps"); do
          l=$(taskset -c "$cpus" /tmp/h6py /work/main/bench/engine/llamacpp_speed.py "models/$m" "$ids" 128 2 1 2>>"$out/speed.err" | tail -n1 || true)
          s=$(taskset -c "$cpus" "$smelt" run --model "models/$m" --prompt-ids "$(cat "$ids")" --max-tokens 128 \
              --ignore-eog --threads 2 --ctx $((512 + 128 + 16)) --json 2>>"$out/speed.err" | tail -n1 || true)
          read -r a b < <(echo "$l" | python3 -c 'import json,sys; v=json.load(sys.stdin); print(v["pp"], v["tg"])' 2>/dev/null || echo "0 0")
          read -r c d < <(echo "$s" | python3 -c 'import json,sys; t=json.load(sys.stdin)["timings"]; print(t["prompt_tokens_per_s"], t["decode_tokens_per_s"])' 2>/dev/null || echo "0 0")
          echo "$m rep $r: llama pp $a tg $b | smelt pp $c tg $d" | tee -a "$out/speed.log"
          lp=$(python3 -c "print(max($lp, $a))"); lt=$(python3 -c "print(max($lt, $b))")
          sp=$(python3 -c "print(max($sp, $c))"); st=$(python3 -c "print(max($st, $d))")
        done
        rows+=("$m $sp $lp $st $lt")
      done
      { echo "== oracle tests"; cat summary 2>/dev/null || true
        echo "CPU: $(lscpu | grep 'Model name' | cut -d: -f2- | sed 's/^ *//'), taskset -c $cpus, 2 threads, best of $reps; ratio = smelt / llama.cpp"
        python3 -c '
import sys
print("%-34s %11s %11s %11s %11s %6s %6s" % ("model", "smelt pp512", "llama pp512", "smelt tg128", "llama tg128", "pp", "tg"))
r = lambda x, y: f"{x / y:>5.2f}x" if y else "   n/a"
for row in sys.argv[1:]:
    name, sp, lp, st, lt = row.split()
    sp, lp, st, lt = map(float, (sp, lp, st, lt))
    print(f"{name:<34} {sp:>11.1f} {lp:>11.1f} {st:>11.1f} {lt:>11.1f} {r(sp, lp)} {r(st, lt)}")' "${rows[@]}"
      } 2>&1 | tee -a "$out/speed.log"
    fi
    echo "== done ($((SECONDS - t0)) s)"
    exit $status
    ;;
  diag)
    # Why the llama.cpp oracle dies there (model loads crashed with no message on the first
    # run, 2026-11-25): one call with .gpu-h6-1 only. SmolLM2's first bytes (its metadata and
    # vocabulary) come with that piece; the file is padded with zeros to its size, so
    # llama.cpp loads it (zero weights past the cut). Builds the oracle in the foreground,
    # then loads vocab-only and whole, with the default and a large stack, and takes a
    # backtrace of a crash with cuda-gdb (the only gdb there).
    out=${OUT:-bench/out}; mkdir -p "$out" /tmp/h6d; p1=$(pwd)/.gpu-h6-1; cd /tmp/h6d
    tar -xzf "$p1/kit.tar"
    tar -xf "$p1/models.tar.part00" 2>/dev/null || true
    m=/tmp/h6d/${models[0]}
    truncate -s 98362432 "$m"  # SmolLM2-135M-Instruct.Q4_1.gguf's size
    ls -la "$m"; ulimit -a | tee "$out/ulimit.log"
    mkdir -p /tmp/site && tar -xzf kit/llcpp-slim.tgz
    python3 -m pip install -q --no-index --no-deps --target /tmp/site kit/*.whl
    CMAKE_ARGS="$oracle_cmake" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install -q --no-build-isolation \
      --no-deps --no-index --target /tmp/site ./llama_cpp_python-*/ > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
    export PYTHONPATH=/tmp/site
    # First run: the crash's frame #0 was a libstdc++ symbol inside libggml.so (a local build
    # exports none): is libstdc++ linked into it statically (two std::locale copies)?
    env | grep -E '^(C|CXX|LD|CPP)FLAGS=|^CMAKE|^LD_|^CC=|^CXX=' || true
    for l in /tmp/site/llama_cpp/lib/lib{ggml,ggml-base,ggml-cpu,llama}.so; do
      echo "$l: $(nm -DC --defined-only "$l" | grep -c 'std::' ) std:: exports, $(nm -C "$l" 2>/dev/null | grep -c codecvt) codecvt symbols; $(ldd "$l" | grep -o 'libstdc++[^ ]* => [^ ]*')"
    done
    cat > /tmp/h6d/t.py <<'PY'
import sys
from llama_cpp import Llama
mode = sys.argv[2]
llm = Llama(model_path=sys.argv[1], vocab_only=(mode == "vocab"), n_ctx=64, n_threads=2, verbose=True)
ids = llm.tokenize(b"Hello world, this is a test.", add_bos=True)
print("ids", ids, flush=True)
if mode == "full":
    llm.eval(ids)
    print("eval ok", flush=True)
PY
    for mode in vocab full; do
      for st in default 1048576; do
        rc=0
        if [ $st = default ]; then python3 -X faulthandler t.py "$m" $mode > "$out/$mode-$st.log" 2>&1 || rc=$?
        else (ulimit -s $st; python3 -X faulthandler t.py "$m" $mode) > "$out/$mode-$st.log" 2>&1 || rc=$?; fi
        echo "== $mode stack=$st rc=$rc: $(grep -E '^(ids|eval ok)|Fatal Python|Segmentation' "$out/$mode-$st.log" | tr '\n' ' ' | cut -c1-200)"
      done
    done
    # The crash is in std::regex's bracket matcher (locale-dependent ctype/codecvt): try the
    # vocab load under other locales.
    echo "locale env: LANG=${LANG:-} LC_ALL=${LC_ALL:-} LC_CTYPE=${LC_CTYPE:-}"
    for loc in C C.UTF-8 POSIX; do
      rc=0; LC_ALL=$loc LANG=$loc python3 -X faulthandler t.py "$m" vocab > "$out/vocab-$loc.log" 2>&1 || rc=$?
      echo "== vocab LC_ALL=$loc rc=$rc: $(grep -E '^ids|Fatal Python|Segmentation' "$out/vocab-$loc.log" | tr '\n' ' ' | cut -c1-200)"
    done
    for v in ${DIAG_ENV:-}; do
      rc=0; env -u "$v" python3 -X faulthandler t.py "$m" vocab > "$out/vocab-no-$v.log" 2>&1 || rc=$?
      echo "== vocab without $v rc=$rc"
    done
    env | cut -c1-120 | grep -vE "KEY|TOKEN|SECRET" > "$out/env.log"
    if command -v cuda-gdb >/dev/null; then
      timeout 120 cuda-gdb -batch -ex run -ex bt -ex 'info registers rip' -ex 'x/4i $pc' --args python3 t.py "$m" vocab > "$out/gdb-vocab.log" 2>&1 || true
      grep -E "^#|SIG|rip|=>" "$out/gdb-vocab.log" | head -40
    fi
    ;;
  *)
    sed -n 2,28p "$0" >&2
    exit 2
    ;;
esac
