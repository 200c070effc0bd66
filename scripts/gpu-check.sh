#!/usr/bin/env bash
# The GPU check, in two halves (the GPU machine needs neither Rust nor a network).
#
#   scripts/gpu-check.sh prepare    here: build the release binary and the GPU test binaries,
#                                   strip them into .gpu/, add the header-only prefixes of the
#                                   real models, twin_gguf.py and the gguf wheel (KILN_OLD=rev:
#                                   also that commit's binary, timed beside this one), the
#                                   kernel cache for sm_90 (examples/cuda_cache.rs) and, with
#                                   KILN_REF_BENCH=path, the reference's llama-bench built here
#                                   for sm_90 (docs/gpu.md: nothing compiles on the GPU machine)
#   scripts/gpu-check.sh run        there, with .gpu/ copied over: make the twins, run the
#                                   GPU tests, then kiln bench --device cuda beside llama-bench
#                                   (when .gpu/llama.cpp/build has it), and print one table
#
# KILN_PHASES=1: the cost of a decode phase apart from its work (benches/cuda_phases.rs).
# KILN_STARTUP=1: seconds to a first token, kernels compiled or cached.
# The host's CPU (issue #19: AMX, thread scaling) in the same call: KILN_CPU_THREADS="2 8 16"
# KILN_CPU_MODELS="smol gemma llama1b" KILN_CPU_AB=1 (kiln on its best tier and held to AVX-512
# VNNI, beside llama.cpp with no CUDA device visible); the CPU kernel tests (the AMX tile kernel
# among them) run with the GPU tests.
#
# Results go to $OUT (or .gpu/out) as gpu-check.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}

prepare() {
    mkdir -p .gpu/whl .gpu/models
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    cargo build --release --bin kiln
    # The binaries are stripped into one folder and go as one xz archive (they share most of
    # their code, which one dictionary finds: a third of compressing each alone); `run`
    # unpacks it.
    local bins=/tmp/kiln-gpu-bins
    rm -rf $bins && mkdir -p $bins
    strip -o $bins/kiln target/release/kiln
    # Test binaries: cargo names each test target's executable in its JSON messages.
    for t in cuda_backend cuda_batch cuda_ring cuda_offload cuda_speculative cuda_kernels cuda_ops cuda_attention cuda_archs cuda_moe cuda_iquants golden_llama golden_archs; do
        exe=$(cargo test --release --test "$t" --no-run --message-format=json 2>/dev/null |
            python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["test"] and m["target"]["name"]==sys.argv[1]: print(m["executable"])' "$t")
        strip -o "$bins/$t" "$exe"
    done
    # The phase-cost probe (benches/cuda_phases.rs; run with KILN_PHASES=1).
    exe=$(cargo bench --bench cuda_phases --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["bench"]: print(m["executable"])')
    strip -o $bins/cuda_phases "$exe"
    # The library's unit tests, for the CPU kernels of the host (its AMX tier, #19).
    exe=$(cargo test --release --lib --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["lib"]: print(m["executable"])')
    strip -o $bins/kiln-lib "$exe"
    # The fixture models the tests use are made from tests/golden (it travels with the tree).
    local models=${KILN_MODELS:-$HOME/.cache/kiln/models}
    for pair in smollm2:SmolLM2-135M-Instruct.Q4_1 gemma3:gemma-3-270m-q4_k_m; do
        local m=${pair#*:} f="$models/${pair#*:}.gguf"
        [ -f "$f" ] || ./target/release/kiln pull "${pair%%:*}" >/dev/null
        off=$(./target/release/kiln inspect "$f" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["data_offset"])')
        head -c "$off" "$f" | xz -T0 -6 > ".gpu/models/$m.head.xz"
        rm -f ".gpu/models/$m.head"
    done
    # An earlier commit's binary to time beside this one (KILN_OLD=<commit>: kiln-old).
    if [ -n "${KILN_OLD:-}" ]; then
        local tree=/tmp/kiln-old-tree
        [ -d $tree ] || git worktree add -f $tree "$KILN_OLD"
        (cd $tree && git checkout -q "$KILN_OLD" && CARGO_TARGET_DIR=$tree/target cargo build --release --bin kiln)
        strip -o $bins/kiln-old $tree/target/release/kiln
    fi
    rm -f .gpu/*.xz .gpu/bins.tar.xz
    tar -C $bins -cf - . | xz -9e -T1 > .gpu/bins.tar.xz
    # The kernel cache for sm_90, built here by the NVRTC of the version the GPU machine loads
    # (KILN_NVRTC_WHEELS: the versions of `nvidia-cuda-nvrtc`; entries are keyed by NVRTC's
    # version, so several live side by side): a first start there compiles nothing.
    rm -rf /tmp/kiln-gpu-cache && mkdir -p /tmp/kiln-gpu-cache
    cargo build --release --example cuda_cache
    for v in ${KILN_NVRTC_WHEELS:-13.0.88}; do
        local w=/tmp/nvrtc-$v
        [ -d $w/nvidia ] || { python3 -m pip download --quiet --no-deps --only-binary=:all: \
            --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --python-version 3.12 \
            -d $w "nvidia-cuda-nvrtc==$v" && unzip -q -o $w/*.whl -d $w; }
        ./target/release/examples/cuda_cache $w/nvidia/cu13/lib/libnvrtc.so.13 /tmp/kiln-gpu-cache/cuda sm_90
    done
    tar -C /tmp/kiln-gpu-cache -cf - cuda | xz -T0 -6 > .gpu/cuda-cache.tar.xz
    # The reference's llama-bench for sm_90, built here (KILN_REF_BENCH: its path; stripped,
    # in xz parts): nothing compiles on the GPU machine.
    if [ -n "${KILN_REF_BENCH:-}" ]; then
        rm -f .gpu/llama-bench.xz.*
        strip -o /tmp/llama-bench-gpu "$KILN_REF_BENCH" && xz -T0 -6 -c /tmp/llama-bench-gpu | split -b 15M - .gpu/llama-bench.xz.
    fi
    # The reference's CPU backend for the GPU machine's host (KILN_REF_CPU: the bin folder of a
    # CPU-only build with GGML_BACKEND_DL and GGML_CPU_ALL_VARIANTS; docs/gpu.md): llama-bench,
    # its libraries and the variants, the best of which it loads there.
    if [ -n "${KILN_REF_CPU:-}" ]; then
        local cpu=/tmp/kiln-gpu-refcpu
        rm -rf $cpu && mkdir -p $cpu
        # (Links stay links; of the variants, the x86 server ones.)
        for f in "$KILN_REF_CPU"/llama-bench "$KILN_REF_CPU"/*.so*; do
            case "$(basename "$f")" in
                libggml-cpu-*) [[ "$f" =~ -(x64|haswell|skylakex|icelake|cooperlake|zen4|sapphirerapids)\.so$ ]] || continue ;;
            esac
            if [ -L "$f" ]; then cp -P "$f" "$cpu/"; else strip -o "$cpu/$(basename "$f")" "$f"; fi
        done
        mv $cpu/llama-bench $cpu/llama-bench.bin
        printf '#!/bin/sh\nd=$(dirname "$0")\nLD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/llama-bench.bin" "$@"\n' > $cpu/llama-bench
        chmod +x $cpu/llama-bench
        tar -C $cpu -cf - . | xz -T0 -6 > .gpu/llama-cpu.tar.xz
    fi
    cp ../shared/tools/twin_gguf.py .gpu/ 2>/dev/null || true
    python3 -m pip download --quiet --no-deps gguf==0.19.0 -d .gpu/whl
    du -sh .gpu
}

run() {
    local out=${OUT:-.gpu/out}
    mkdir -p "$out" .gpu/tmp/models
    local log="$out/gpu-check.txt"
    exec > >(tee "$log") 2>&1
    xz -d -c .gpu/bins.tar.xz | tar -C .gpu -xf -
    for f in .gpu/models/*.head.xz; do [ -f "$f" ] && xz -d -c "$f" > "${f%.xz}"; done
    # The kernel cache built at `prepare` (read as `cuda/` beside KILN_MODELS, below).
    [ -f .gpu/cuda-cache.tar.xz ] && xz -d -c .gpu/cuda-cache.tar.xz | tar -C .gpu/tmp -xf -
    # The reference's CUDA libraries (cuBLAS, the runtime) come from the machine's toolkit.
    export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "NVRTC here: $(ls /usr/local/cuda/lib64/libnvrtc.so.* 2>/dev/null | tr '\n' ' '); kernel cache: $(ls .gpu/tmp/cuda 2>/dev/null | wc -l) files"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader || true
    lscpu | grep -E '^(Model name|Thread|Core|Socket|NUMA node\(s\)|L2|L3)' || true
    echo "CPU: $(grep -o -w -E 'avx512[a-z_0-9]*|amx_[a-z0-9]*|avx_vnni|bmi2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    # The reference (llama.cpp CUDA) builds in the background while the tests run (~6 min).
    local ref=.gpu/llama.cpp
    # A llama-bench brought back by an earlier run (static, xz parts) saves the build.
    if ls .gpu/llama-bench.xz.* >/dev/null 2>&1 && [ ! -x $ref/build/bin/llama-bench ]; then
        mkdir -p $ref/build/bin && cat .gpu/llama-bench.xz.* | xz -d > $ref/build/bin/llama-bench
        chmod +x $ref/build/bin/llama-bench && echo 0 > $ref/build.rc
    fi
    if [ -z "${KILN_NO_REF:-}" ] && [ -f .gpu/llama.cpp.tar.gz ] && [ ! -x $ref/build/bin/llama-bench ]; then
        mkdir -p $ref && tar xzf .gpu/llama.cpp.tar.gz -C $ref
        (cd $ref && setsid bash -c 'cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
            -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF \
            -DCMAKE_BUILD_TYPE=Release > build.log 2>&1 && nice cmake --build build -j16 --target llama-bench >> build.log 2>&1; echo $? > build.rc' \
            < /dev/null > /dev/null 2>&1 &)
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/gguf-*.whl && export PYTHONPATH=/tmp/site
    local m=.gpu/models
    # The models to bench (KILN_BENCH_MODELS: of "smol gemma llama1b llama8b olmoe gptoss";
    # the mixtures only when named).
    local want=" ${KILN_BENCH_MODELS:-smol gemma llama1b llama8b} "
    [ -f $m/smol.gguf ] || python3 .gpu/twin_gguf.py twin $m/SmolLM2-135M-Instruct.Q4_1.head $m/smol.gguf
    [ -f $m/gemma.gguf ] || { [[ "$want" != *" gemma "* ]] && [ -n "${KILN_SKIP_TESTS:-}" ]; } || python3 .gpu/twin_gguf.py twin $m/gemma-3-270m-q4_k_m.head $m/gemma.gguf
    # The llama shapes (no test reads them) are written in the background while the tests run
    # (the 8B's 4.3 GB take most of a minute); the benches wait for them.
    local twins=()
    for shape in "llama1b 16 2048 8192" "llama8b 32 4096 14336"; do
        read -r c layers dim ffn <<< "$shape"
        [ -f $m/$c.gguf ] || [[ "$want" != *" $c "* ]] && continue
        python3 .gpu/twin_gguf.py llama $m/SmolLM2-135M-Instruct.Q4_1.head $m/$c.gguf --layers $layers \
            --dim $dim --ffn $ffn --heads 32 --kv-heads 8 --vocab 128256 > .gpu/tmp/twin-$c.log 2>&1 &
        twins+=($!)
    done
    # Mixtures of experts (scripts/twin-moe.py: the real shapes and the reference's formats,
    # random blocks; OLMoE-1B-7B Q4_K_M ~4 GB, gpt-oss-20b MXFP4 ~12 GB), when named.
    for c in olmoe gptoss; do
        [ -f $m/$c.gguf ] || [[ "$want" != *" $c "* ]] && continue
        python3 scripts/twin-moe.py ${c/gptoss/gpt-oss} $m/$c.gguf > .gpu/tmp/twin-$c.log 2>&1 &
        twins+=($!)
    done
    # The real models cannot travel: their twins (real header and tokenizer, random blocks)
    # stand in for them under their own names.
    export KILN_REAL_SMOLLM2=$PWD/$m/smol.gguf KILN_REAL_GEMMA3=$PWD/$m/gemma.gguf
    # NVRTC of the toolkit, for the kernel tests.
    local nvrtc
    nvrtc=$(ls /usr/local/cuda/lib64/libnvrtc.so.1* 2>/dev/null | head -1 || true)
    export KILN_TEST_ROOT=$PWD KILN_TEST_TMP=$PWD/.gpu/tmp KILN_PLAN_MODEL=$PWD/$m/gemma.gguf
    export KILN_MODELS=$PWD/.gpu/tmp/models RUST_BACKTRACE=1
    # KILN_TESTS="cuda_moe ...": those test binaries alone, in place of the whole set.
    if [ -n "${KILN_TESTS:-}" ] && [ -z "${KILN_SKIP_TESTS:-}" ]; then
        echo "== tests (${SECONDS}s): $KILN_TESTS"
        for t in $KILN_TESTS; do
            timeout 180 .gpu/$t ${KILN_TEST_FILTER:-} --test-threads 1 --nocapture 2>&1 | grep -v '^$' | tail -25 || true
        done
    elif [ -z "${KILN_SKIP_TESTS:-}" ]; then
        echo "== kernel tests (${SECONDS}s)"
        for t in cuda_ops cuda_attention; do
            timeout 120 .gpu/$t --test-threads 1 --nocapture 2>&1 | grep -E "worst|^test|panicked" | tail -30 || true
        done
        KILN_NVRTC=$nvrtc timeout 120 .gpu/cuda_kernels --test-threads 1 --skip device_ --skip compiled_kernels --skip command_line_on_the_software_gpu --skip every_kernel_compiles 2>&1 | tail -8 || true
        # (KILN_SKIP_CPU_TESTS=1: the GPU's tests alone.)
        if [ -z "${KILN_SKIP_CPU_TESTS:-}" ]; then
            echo "== CPU kernel tests (${SECONDS}s): quant, AMX among them where the host has it"
            timeout 120 .gpu/kiln-lib quant:: --test-threads 4 --nocapture 2>&1 | grep -E "skipped|panicked|test result" | tail -8 || true
            # The random models' goldens on the host's default tier (AMX where it has it; the
            # real models cannot travel).
            for t in golden_llama golden_archs; do
                [ -x .gpu/$t ] && { timeout 180 .gpu/$t --skip smollm2 --skip gemma3 --test-threads 4 --nocapture 2>&1 |
                    grep -E "top-1|greedy|panicked|test result|kernels" | tail -30 || true; }
            done
        fi
        echo "== GPU tests (${SECONDS}s)"
        timeout ${KILN_TEST_TIMEOUT:-300} .gpu/cuda_backend ${KILN_TEST_FILTER:-} --include-ignored --test-threads 1 --nocapture 2>&1 | grep -v '^$' | tail -120 || true
        # (The served test needs this machine's kiln binary and software GPU.)
        timeout 180 .gpu/cuda_batch ${KILN_TEST_FILTER:-} --skip serve_on_the_software --test-threads 1 --nocapture 2>&1 | grep -v '^$' | tail -30 || true
        timeout 180 .gpu/cuda_ring ${KILN_TEST_FILTER:-} --test-threads 1 --nocapture 2>&1 | grep -v '^$' | tail -20 || true
        timeout 180 .gpu/cuda_offload ${KILN_TEST_FILTER:-} --test-threads 1 --nocapture 2>&1 | grep -v '^$' | tail -20 || true
        # (The command-line test needs this machine's kiln binary and software GPU.)
        timeout 180 .gpu/cuda_speculative ${KILN_TEST_FILTER:-} --skip run_speculates_on_the_software --test-threads 1 --nocapture 2>&1 | grep -v '^$' | tail -20 || true
        # Architectures' features, mixtures of experts and i-quants on the device.
        for t in cuda_archs cuda_moe cuda_iquants; do
            [ -x .gpu/$t ] && { timeout 180 .gpu/$t ${KILN_TEST_FILTER:-} --test-threads 1 --nocapture 2>&1 | grep -v '^$' | tail -25 || true; }
        done
    fi
    # Start-up (KILN_STARTUP=1): seconds to a first token with no kernel cache (NVRTC on every
    # core), then twice from kiln's cache (device code loaded as it is), the driver's own JIT
    # cache off throughout, so a fallback to PTX would show as slow cached starts (and is said:
    # KILN_CUDA_TRACE).
    if [ -n "${KILN_STARTUP:-}" ]; then
        echo "== start-up (${SECONDS}s): kiln bench -p 16 -n 1 on smol, $(nproc) cores"
        local sdir="$PWD/.gpu/tmp/startup"
        rm -rf "$sdir" && mkdir -p "$sdir/models"
        for c in "no kernel cache" "kernel cache" "kernel cache"; do
            local t0 t1
            t0=$(date +%s.%N)
            if CUDA_CACHE_DISABLE=1 KILN_MODELS="$sdir/models" KILN_CUDA_TRACE=1 timeout 120 .gpu/kiln bench \
                -m "$m/smol.gguf" --device cuda -p 16 -n 1 -r 1 > /dev/null 2> "$sdir/err"; then
                t1=$(date +%s.%N)
                echo "$c: $(python3 -c "print(round($t1 - $t0, 2))") s"
                grep -m1 "device code refused" "$sdir/err" || true
            else
                echo "$c: failed"; tail -3 "$sdir/err"
            fi
        done
    fi
    # What a decode phase costs apart from its work: a kernel boundary against a grid-wide
    # barrier (benches/cuda_phases.rs, a few seconds).
    if [ -n "${KILN_PHASES:-}" ] && [ -x .gpu/cuda_phases ]; then
        echo "== phases (${SECONDS}s)"
        timeout 120 .gpu/cuda_phases 2>&1 | tail -12 || true
    fi
    # Speculative decoding on the GPU (KILN_SPEC_BENCH=1): greedy decoding of 200 tokens
    # plainly and with prompt lookup (the twins' random weights repeat themselves, which the
    # lookup finds: a figure of what a pass costs against the steps it saves, not of real text).
    if [ -n "${KILN_SPEC_BENCH:-}" ]; then
        for p in "${twins[@]}"; do wait "$p" || echo "a twin failed"; done
        twins=()
        echo "== speculation (${SECONDS}s): kiln run --device cuda -n 200 --temp 0, plain vs ngram-simple"
        for c in ${KILN_SPEC_MODELS:-smol llama8b}; do
            [ -f "$m/$c.gguf" ] || continue
            for spec in "" "--spec-type ngram-simple --draft-max 8" "--spec-type ngram-simple --draft-max 16" ""; do
                timeout 120 .gpu/kiln run -m "$m/$c.gguf" --device cuda -n 200 --temp 0 --ignore-eos \
                    -p "The list of numbers: one two three one two three one two three" --json $spec 2>/dev/null |
                    python3 -c 'import json,sys,hashlib
ls=[json.loads(l) for l in sys.stdin]; d=ls[-1]; s=d.get("speculative") or {}
text="".join(l.get("text","") for l in ls[:-1])
print("%s %-40s gen %7.1f tok/s  passes %s drafted %s kept %s  text %s" % (sys.argv[1], sys.argv[2] or "plain", d["gen_tps"], s.get("passes","-"), s.get("drafted","-"), s.get("accepted","-"), hashlib.md5(text.encode()).hexdigest()[:8]))' "$c" "$spec" || echo "$c $spec: failed"
            done
        done
    fi
    for p in "${twins[@]}"; do wait "$p" || echo "a twin failed"; done
    cat .gpu/tmp/twin-*.log 2>/dev/null || true
    # (kiln alone first: the reference builds meanwhile.)
    # What each optimization is worth: kiln bench with one switch off at a time (KILN_AB_SETS:
    # "defaults" or VAR=value, space-separated; KILN_AB_BENCH: the bench's arguments, several
    # sets separated by ';'; KILN_AB_MODELS: of "smol gemma llama1b llama8b", for this and, unless
    # KILN_OLD_MODELS names others, the earlier binary's comparison).
    # Rows of `kiln bench --device cuda`: for each ';'-separated set of bench arguments (`$1`)
    # and model of KILN_AB_MODELS, one line per variant (`$2`...: "ENV=value@binary",
    # "defaults@binary").
    compare() {
        local benches
        IFS=';' read -ra benches <<< "$1"
        shift
        for args in "${benches[@]}"; do
            echo "== $title (${SECONDS}s): bench $args"
            for c in ${models:-smol llama8b}; do
                [ -f "$m/$c.gguf" ] || continue
                for v in "$@"; do
                    local envs=${v%@*} k=${v#*@}
                    [ "$envs" = defaults ] && envs=
                    echo "$c ${envs:-defaults} $k: $(env $envs timeout 60 "$k" bench -m "$m/$c.gguf" --device cuda $args -r 3 --json 2>/dev/null |
                        python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join("%s=%.0f"%(r["test"],r["avg_ts"]) for r in d))' || echo failed)"
                done
            done
        done
    }
    ab() {
        if [ -n "${KILN_AB:-}" ]; then
            local variants=()
            for e in ${KILN_AB_SETS:-defaults KILN_CUDA_FUSE=0 KILN_CUDA_REPACK=0 KILN_CUDA_MIRROR=0 KILN_CUDA_MV_THREADS=32 KILN_CUDA_MV_THREADS=256 defaults}; do
                variants+=("$e@.gpu/kiln")
            done
            title="A/B" models=${KILN_AB_MODELS:-} compare "${KILN_AB_BENCH:--p 0 -n 128}" "${variants[@]}"
        fi
        # The earlier commit's binary beside this one, alternating (KILN_OLD_BENCH: the bench's
        # arguments, ';'-separated sets; tg128 from an empty context by default).
        if [ -x .gpu/kiln-old ]; then
            title="this commit vs ${KILN_OLD:-the earlier binary}" models=${KILN_OLD_MODELS:-${KILN_AB_MODELS:-}} \
                compare "${KILN_OLD_BENCH:--p 0 -n 128}" \
                defaults@.gpu/kiln-old defaults@.gpu/kiln defaults@.gpu/kiln-old defaults@.gpu/kiln
        fi
    }
    side_by_side() {
        # Wait for the reference build (at most KILN_REF_WAIT seconds).
        local waited=0
        while [ -d $ref ] && [ ! -f $ref/build.rc ] && [ $waited -lt ${KILN_REF_WAIT:-420} ]; do
            sleep 5; waited=$((waited + 5))
        done
        [ -f $ref/build.log ] && { echo "== reference build (rc $(cat $ref/build.rc 2>/dev/null || echo running))"; tail -3 $ref/build.log; }
        echo "== bench (${SECONDS}s; kiln --device cuda beside llama-bench -ngl 99 -fa 1)"
        for pair in "smol:SmolLM2 Q4_1" "gemma:Gemma-3 Q4_K_M" "llama1b:Llama-1B Q4_0" "llama8b:Llama-8B Q4_0" \
            "olmoe:OLMoE-1B-7B Q4_K_M" "gptoss:gpt-oss-20b MXFP4"; do
            local f=$m/${pair%%:*}.gguf name=${pair#*:}
            [[ "$want" == *" ${pair%%:*} "* ]] || continue
            local k r
            k=$(timeout 120 .gpu/kiln bench -m "$f" --device cuda -p 512 -n 128 -r 3 --json 2>>"$out/bench-err.txt" |
                python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join("%s=%.0f"%(r["test"],r["avg_ts"]) for r in d))' || echo "failed")
            r="-"
            if [ -x $ref/build/bin/llama-bench ]; then
                r=$(timeout 120 $ref/build/bin/llama-bench -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o json 2>/dev/null |
                    python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join("%s=%.0f"%("pp%d"%x["n_prompt"] if x["n_prompt"] else "tg%d"%x["n_gen"], x["avg_ts"]) for x in d))' || echo "failed")
            fi
            table+=("| $name | $k | $r |")
            echo "${table[-1]}"
        done
        tail -20 "$out/bench-err.txt" 2>/dev/null || true
        # Decode at depth 4096 (the issue's third column).
        for pair in "smol:SmolLM2 Q4_1" "llama8b:Llama-8B Q4_0"; do
            local f=$m/${pair%%:*}.gguf name=${pair#*:} k r="-"
            [ -n "${KILN_NO_DEPTH:-}" ] && continue
            [[ "$want" == *" ${pair%%:*} "* ]] || continue
            k=$(timeout 120 .gpu/kiln bench -m "$f" --device cuda -p 0 -n 128 -d 4096 -r 3 --json 2>>"$out/bench-err.txt" |
                python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join("%s=%.0f"%(r["test"],r["avg_ts"]) for r in d))' || echo "failed")
            if [ -x $ref/build/bin/llama-bench ]; then
                r=$(timeout 120 $ref/build/bin/llama-bench -m "$f" -ngl 99 -fa 1 -p 0 -n 128 -d 4096 -r 3 -o json 2>/dev/null |
                    python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join("tg%d@d%d=%.0f"%(x["n_gen"], x["n_depth"], x["avg_ts"]) for x in d))' || echo "failed")
            fi
            table+=("| $name (depth 4096) | $k | $r |")
            echo "${table[-1]}"
        done
    }
    # A reference brought built runs first beside kiln; one building here meanwhile, after the A/B.
    local table=()
    # (KILN_NO_BENCH=1: neither.)
    if [ -n "${KILN_NO_BENCH:-}" ]; then :
    elif [ -x $ref/build/bin/llama-bench ]; then side_by_side; ab; else ab; side_by_side; fi
    # KV offload (KILN_OFFLOAD_BENCH=1): decode at depth 4096 with the cache on the device,
    # then in pinned host memory through a ring of 4 layers (--kv-budget), and the reference
    # with its cache in host memory (-nkvo 1).
    if [ -n "${KILN_OFFLOAD_BENCH:-}" ]; then
        echo "== KV offload (${SECONDS}s): tg32 at depth 4096"
        for pair in "smol:14MiB" "llama8b:72MiB"; do
            local f=$m/${pair%%:*}.gguf
            [ -f "$f" ] || continue
            for kv in "" "--kv-budget ${pair#*:}"; do
                echo "$(basename $f) ${kv:-resident}: $(timeout 120 .gpu/kiln bench -m "$f" --device cuda -p 0 -n 32 -d 4096 -r 2 $kv --json 2>&1 |
                    python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join("%s=%.1f"%(r["test"],r["avg_ts"]) for r in d))' || echo failed)"
            done
            [ -x $ref/build/bin/llama-bench ] && echo "$(basename $f) reference -nkvo 1: $(timeout 120 $ref/build/bin/llama-bench -m "$f" -ngl 99 -fa 1 -nkvo 1 -p 0 -n 32 -d 4096 -r 2 -o json 2>/dev/null |
                python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join("tg%d@d%d=%.1f"%(x["n_gen"], x["n_depth"], x["avg_ts"]) for x in d))' || echo failed)"
        done
    fi
    # The reference on the CPU: a CPU-only build with every x86 variant, the one the host runs
    # best picked at load (`.gpu/llama-cpu.tar.xz`: llama-bench and its libraries; see
    # docs/gpu.md), else the CUDA build with no device visible.
    local cpu_ref=.gpu/tmp/llama-cpu
    if [ -f .gpu/llama-cpu.tar.xz ]; then
        mkdir -p $cpu_ref && xz -d -c .gpu/llama-cpu.tar.xz | tar -C $cpu_ref -xf -
        # A variant that stops on this host (the `sapphirerapids` one did, with an illegal
        # instruction, on the H200's Xeon host on 2026-11-30) is left out for the next best.
        if [ -n "${KILN_CPU_THREADS:-}" ] && [ -f $m/smol.gguf ]; then
            for _ in 1 2 3 4; do
                local v rc=0
                timeout 60 $cpu_ref/llama-bench -m $m/smol.gguf -t 2 -p 16 -n 2 -r 1 > /dev/null 2> .gpu/tmp/cpu-ref-probe.txt || rc=$?
                v=$(grep -o 'libggml-cpu-[a-z0-9]*\.so' .gpu/tmp/cpu-ref-probe.txt | head -1)
                echo "reference CPU variant: ${v:-?} (rc $rc)"
                [ $rc = 0 ] || [ -z "$v" ] && break
                rm -f "$cpu_ref/$v"
            done
        fi
    elif [ -x $ref/build/bin/llama-bench ]; then
        mkdir -p $cpu_ref && printf '#!/bin/sh\nCUDA_VISIBLE_DEVICES= exec %s -ngl 0 "$@"\n' "$PWD/$ref/build/bin/llama-bench" > $cpu_ref/llama-bench
        chmod +x $cpu_ref/llama-bench
    fi
    # The host's CPU by thread count (KILN_CPU_THREADS, e.g. "2 8 16"; issue #19): kiln on its
    # best tier, kiln held to AVX-512 VNNI (KILN_CPU_AB=1: without the AMX tier), and the
    # reference on the CPU alone (no CUDA device visible), on KILN_CPU_MODELS (default smol).
    for t in ${KILN_CPU_THREADS:-}; do
        [ "$t" = "${KILN_CPU_THREADS%% *}" ] && echo "== CPU ($(nproc) threads here; ${SECONDS}s)"
        for c in ${KILN_CPU_MODELS:-smol}; do
            [ -f $m/$c.gguf ] || continue
            local isas=default
            [ -n "${KILN_CPU_AB:-}" ] && isas="default avx512vnni"
            for isa in $isas; do
                local e=
                [ "$isa" = default ] || e="KILN_ISA=$isa"
                echo "$c CPU -t $t kiln ${isa}: $(env $e timeout 120 .gpu/kiln bench -m $m/$c.gguf -t $t -p 512 -n 64 -r 2 --json 2>/dev/null |
                    python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join("%s=%.0f (%s)"%(r["test"],r["avg_ts"],r.get("kernels","")) for r in d))' || echo failed)"
            done
            if [ -x $cpu_ref/llama-bench ]; then
                echo "$c CPU -t $t llama.cpp: $(timeout 120 $cpu_ref/llama-bench -m $m/$c.gguf -t $t -p 512 -n 64 -r 2 -o json 2>>"$out/cpu-ref-err.txt" |
                    python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join("%s=%.0f"%("pp%d"%x["n_prompt"] if x["n_prompt"] else "tg%d"%x["n_gen"], x["avg_ts"]) for x in d))' || echo failed)"
            fi
        done
    done
    # Where a decode step's time goes (KILN_PROFILE; ops run one at a time, each timed with a
    # synchronization, so small ops carry the launch; the totals rank them).
    # (KILN_PROFILE_MODELS: of "smol gemma llama1b llama8b"; KILN_PROFILE_BENCH: the bench's
    # arguments, several sets separated by ';'.)
    if [ -n "${KILN_PROFILE:-}" ]; then
        local pbenches
        IFS=';' read -ra pbenches <<< "${KILN_PROFILE_BENCH:--p 0 -n 32}"
        for c in ${KILN_PROFILE_MODELS:-smol llama8b}; do
            [ -f "$m/$c.gguf" ] || continue
            for args in "${pbenches[@]}"; do
                echo "== profile $c ($args)"
                KILN_CUDA_PROFILE=1 timeout 120 .gpu/kiln bench -m "$m/$c.gguf" --device cuda $args -r 1 2>&1 | grep -A16 "CUDA profile" | head -30 || true
            done
        done
    fi
    # Each kernel's own device time in a few decode steps (KILN_NCU=1: Nsight Compute, graph
    # nodes one by one, clocks left alone, caches flushed before each), as CSV under $OUT for
    # summing per kernel and token (KILN_NCU_MODELS, KILN_NCU_KERNELS: how many kernels).
    if [ -n "${KILN_NCU:-}" ] && command -v ncu >/dev/null; then
        for c in ${KILN_NCU_MODELS:-smol llama8b}; do
            local f=$m/$c.gguf
            [ -f "$f" ] || continue
            echo "== ncu $(basename $f) (${SECONDS}s)"
            timeout 120 ncu --clock-control none --graph-profiling node --metrics gpu__time_duration.sum \
                --csv -c ${KILN_NCU_KERNELS:-2000} .gpu/kiln bench -m "$f" --device cuda -p 0 -n 4 -r 1 \
                > "$out/ncu-$(basename $f .gguf).csv" 2> "$out/ncu-$(basename $f .gguf).err" || true
            wc -l "$out/ncu-$(basename $f .gguf).csv"; tail -2 "$out/ncu-$(basename $f .gguf).err"
        done
    fi
    # Bring the reference back for the next run (static; the parts go under $OUT).
    if [ -n "${KILN_KEEP_REF:-}" ] && [ -x $ref/build/bin/llama-bench ] && ! ls .gpu/llama-bench.xz.* >/dev/null 2>&1; then
        strip -o /tmp/llama-bench $ref/build/bin/llama-bench && xz -T16 -6 -c /tmp/llama-bench | split -b 15M - "$out/llama-bench.xz."
        ls -la "$out" | grep llama-bench || true
    fi
    echo "== done (${SECONDS}s; kernel cache: $(ls .gpu/tmp/cuda 2>/dev/null | wc -l) files)"
    echo
    echo "| model | kiln (t/s) | llama.cpp CUDA (t/s) |"
    echo "| --- | --- | --- |"
    printf '%s\n' "${table[@]}"
}

case "$mode" in
    prepare) prepare ;;
    run) run ;;
    *) sed -n '2,18p' "$0"; exit 2 ;;
esac
