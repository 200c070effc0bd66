#!/usr/bin/env bash
# The GPU check, in two halves (see ../shared/GPU.md: the GPU machine has no Rust and no network).
#
#   scripts/gpu-check.sh prepare    here: build the release binary and the GPU test binaries,
#                                   strip them into .gpu/, add the header-only prefixes of the
#                                   real models, twin_gguf.py and the gguf wheel
#   scripts/gpu-check.sh run        there (device tool, carry [".gpu"]): make the twins, run the
#                                   GPU tests, then kiln bench --device cuda beside llama-bench
#                                   (when .gpu/llama.cpp/build has it), and print one table
#
# Results go to $OUT (or .gpu/out) as gpu-check.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}

prepare() {
    mkdir -p .gpu/whl .gpu/models
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    cargo build --release --bin kiln
    strip -o .gpu/kiln target/release/kiln
    # Test binaries: cargo names each test target's executable in its JSON messages.
    for t in cuda_backend cuda_kernels; do
        exe=$(cargo test --release --test "$t" --no-run --message-format=json 2>/dev/null |
            python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["test"] and m["target"]["name"]==sys.argv[1]: print(m["executable"])' "$t")
        strip -o ".gpu/$t" "$exe"
    done
    # The fixture models the tests use are made from tests/golden (it travels with the tree).
    local models=${KILN_MODELS:-$HOME/.cache/kiln/models}
    for pair in smollm2:SmolLM2-135M-Instruct.Q4_1 gemma3:gemma-3-270m-q4_k_m; do
        local m=${pair#*:} f="$models/${pair#*:}.gguf"
        [ -f "$f" ] || ./target/release/kiln pull "${pair%%:*}" >/dev/null
        off=$(./target/release/kiln inspect "$f" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["data_offset"])')
        head -c "$off" "$f" > ".gpu/models/$m.head"
    done
    cp ../shared/tools/twin_gguf.py .gpu/ 2>/dev/null || true
    python3 -m pip download --quiet --no-deps gguf==0.19.0 -d .gpu/whl
    du -sh .gpu
}

run() {
    local out=${OUT:-.gpu/out}
    mkdir -p "$out" .gpu/tmp
    local log="$out/gpu-check.txt"
    exec > >(tee "$log") 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    pip install --quiet --no-index --no-deps .gpu/whl/gguf-*.whl 2>/dev/null || true
    local m=.gpu/models
    [ -f $m/smol.gguf ] || python3 .gpu/twin_gguf.py twin $m/SmolLM2-135M-Instruct.Q4_1.head $m/smol.gguf
    [ -f $m/gemma.gguf ] || python3 .gpu/twin_gguf.py twin $m/gemma-3-270m-q4_k_m.head $m/gemma.gguf
    [ -f $m/llama1b.gguf ] || python3 .gpu/twin_gguf.py llama $m/SmolLM2-135M-Instruct.Q4_1.head $m/llama1b.gguf \
        --layers 16 --dim 2048 --ffn 8192 --heads 32 --kv-heads 8 --vocab 128256
    [ -f $m/llama8b.gguf ] || python3 .gpu/twin_gguf.py llama $m/SmolLM2-135M-Instruct.Q4_1.head $m/llama8b.gguf \
        --layers 32 --dim 4096 --ffn 14336 --heads 32 --kv-heads 8 --vocab 128256
    # NVRTC of the toolkit, for the kernel tests.
    local nvrtc
    nvrtc=$(ls /usr/local/cuda/lib64/libnvrtc.so.1* 2>/dev/null | head -1 || true)
    export KILN_TEST_ROOT=$PWD KILN_TEST_TMP=$PWD/.gpu/tmp KILN_PLAN_MODEL=$PWD/$m/gemma.gguf
    export KILN_MODELS=$PWD/.gpu/tmp/models
    echo "== kernel tests"
    KILN_NVRTC=$nvrtc .gpu/cuda_kernels --test-threads 1 --skip device_ --skip compiled_kernels 2>&1 | tail -8 || true
    echo "== GPU tests"
    .gpu/cuda_backend --test-threads 1 --nocapture 2>&1 | grep -v '^$' || true
    echo "== bench (kiln --device cuda)"
    local table=()
    for pair in "smol:SmolLM2 Q4_1" "gemma:Gemma-3 Q4_K_M" "llama1b:Llama-1B Q4_0" "llama8b:Llama-8B Q4_0"; do
        local f=$m/${pair%%:*}.gguf name=${pair#*:}
        local k r
        k=$(.gpu/kiln bench -m "$f" --device cuda -p 512 -n 128 -r 3 --json 2>/dev/null |
            python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join("%s=%.0f"%(r["test"],r["avg_ts"]) for r in d))' || echo "failed")
        r="-"
        if [ -x .gpu/llama.cpp/build/bin/llama-bench ]; then
            r=$(.gpu/llama.cpp/build/bin/llama-bench -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o json 2>/dev/null |
                python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join("%s=%.0f"%("pp%d"%x["n_prompt"] if x["n_prompt"] else "tg%d"%x["n_gen"], x["avg_ts"]) for x in d))' || echo "failed")
        fi
        table+=("| $name | $k | $r |")
    done
    echo
    echo "| model | kiln (t/s) | llama.cpp CUDA (t/s) |"
    echo "| --- | --- | --- |"
    printf '%s\n' "${table[@]}"
}

case "$mode" in
    prepare) prepare ;;
    run) run ;;
    *) sed -n '2,12p' "$0"; exit 2 ;;
esac
