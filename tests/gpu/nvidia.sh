#!/usr/bin/env bash
# Runs the kernel tests (and benchmarks) on an NVIDIA GPU through the embedded PTX.
#
#   tests/gpu/nvidia.sh            # machine with Rust and an NVIDIA GPU: build and run
#   tests/gpu/nvidia.sh bundle     # machine with Rust, no GPU: build binaries into .device-bin/
#   tests/gpu/nvidia.sh bundle-tests  # the same, test binaries only (no benchmarks)
#   tests/gpu/nvidia.sh pack DIR   # compress the bundle into DIR/bundle.tar.xz (the `device`
#                                  # tool carries at most 64 MiB); on the GPU machine:
#                                  # tar -xJf DIR/bundle.tar.xz -C /tmp && /tmp/.device-bin/nvidia.sh report ...
#   tests/gpu/nvidia.sh run        # GPU machine without Rust: run what `bundle` built
#   tests/gpu/nvidia.sh report DIR [PART...]
#                                  # GPU machine: the tests (GPU only) and every benchmark
#                                  # against its peer, results under DIR; PARTs (default
#                                  # all): tests llm quantized matvec gemm conv attention e2e
#                                  # qe2e engine serve sd; `nccl`: the 2-GPU collectives and
#                                  # tensor-parallel tests, `tp`: the TP=1 / TP=2 bench of
#                                  # the 8B-shaped bf16 model, `tpbig`: the 48B-shaped bf16
#                                  # model (97 GB) at TP=2, bench and serve (all 2 GPUs, not
#                                  # in the default)
#
# `bundle` + `run` is how the project's H100 checks are made: the GPU machine has CUDA and
# PyTorch but no Rust toolchain, so x86-64 binaries built here travel there.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
if [ "$(basename "$HERE")" = .device-bin ] || ls "$HERE"/test-* >/dev/null 2>&1; then
    # Running the copy inside a bundle (`.device-bin/nvidia.sh run`; a bundle may hold no
    # test binaries when only benchmarks travel).
    BIN="$HERE"
else
    cd "$HERE/../.."
    BIN=.device-bin
fi
TARGET="${CARGO_TARGET_DIR:-target}"

# Copies the test executables of cargo's JSON messages (stdin) into $BIN as test-NAME.
collect_tests() {
    python3 -c '
import json, sys, shutil
seen = set()
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        name = m["target"]["name"]
        # Two crates have a test of this name (kernels and candle-rocm: quantized): keep both.
        if name in seen:
            name = m["package_id"].split("#")[0].rstrip("/").split("/")[-1].replace("-", "_") + "-" + name
        seen.add(name)
        shutil.copy(m["executable"], sys.argv[1] + "/test-" + name)
        print("bundled test", name)
' "$BIN"
}

# The test binaries of the crates whose kernels run on a GPU (release, CUDA path on), the
# fixtures they read and the PTX for the ptxas report, into $BIN.
bundle_tests() {
    mkdir -p "$BIN"
    # The NVIDIA machine needs the PTX only: leave the AMD code objects out of these
    # binaries (the CPU-side tests of the code objects run in `cargo test --workspace`).
    export KERNEL_ARCHS="${KERNEL_ARCHS:-none}"
    # Every crate with GPU work and a `cuda` feature (DIR or DIR:PACKAGE when the names differ).
    local args=() features=()
    for c in kernels candle-rocm attention kernel-dsl/collectives:kernel-collectives; do
        local dir="${c%%:*}" pkg="${c##*:}"
        if grep -q '^cuda *=' "$dir/Cargo.toml" 2>/dev/null; then args+=(-p "$pkg"); features+=("$pkg/cuda"); fi
    done
    cargo test --release "${args[@]}" --features "$(IFS=,; echo "${features[*]}")" --no-run --message-format=json 2>/dev/null | collect_tests
    # Tensor parallelism on two GPUs (llm-worker's only GPU test binary; its other tests are CPU tests).
    cargo test --release -p llm-worker --features llm-worker/cuda --test tp_gpu --no-run --message-format=json 2>/dev/null | collect_tests
    cp tests/gpu/nvidia.sh tests/gpu/ptxas_report.py "$BIN/"
    # Test fixtures (Candle-written quantized blocks) the binaries read at run time.
    rm -rf "$BIN/data" && cp -r kernels/tests/data "$BIN/data"
    # The kernels' PTX, for the ptxas register/spill report on the GPU machine.
    cp "$(ls -t "$TARGET"/release/build/kernels-*/out/gpu/sm_*/kernels.sm_*.ptx | head -1)" "$BIN/kernels.ptx"
    strip "$BIN"/test-* 2>/dev/null || true
}

bundle() {
    # Keep the benchmark peers built here (benches/candle-peer/build.sh, an hour to rebuild;
    # benches/cuda/build-cutlass-peer.sh; benches/cuda/build-read-ceiling.sh).
    local keep
    keep="$(mktemp -d)"
    for p in candle-peer cutlass-sm80-gemm read-ceiling; do
        if [ -f "$BIN/$p" ]; then cp "$BIN/$p" "$keep/"; fi
    done
    rm -rf "$BIN" && mkdir -p "$BIN"
    for p in "$keep"/*; do
        if [ -f "$p" ]; then mv "$p" "$BIN/" && chmod +x "$BIN/$(basename "$p")"; fi
    done
    rmdir "$keep" 2>/dev/null || true
    bundle_tests
    if [ -d benches/src ] && grep -q '\[\[bin\]\]' benches/Cargo.toml 2>/dev/null; then
        cargo build --release -p benches --features cuda --bins
        for b in $(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
m = json.load(sys.stdin)
for p in m["packages"]:
    if p["name"] == "benches":
        for t in p["targets"]:
            if "bin" in t["kind"]: print(t["name"])'); do
            cp "$TARGET/release/$b" "$BIN/bench-$b"
            echo "bundled bench $b"
        done
        cp -r benches/python "$BIN/python" 2>/dev/null || true
    fi
    # Our side of the end-to-end LLM benchmark (its peer: benches/candle-peer/build.sh).
    cargo build --release -p candle-rocm --features cuda --example llama_e2e
    cp "$TARGET/release/examples/llama_e2e" "$BIN/bench-llama-e2e"
    # The GGUF LLM worker and the random-GGUF writer (README, "Quantized models").
    cargo build --release -p candle-rocm --features cuda --example qllama_e2e
    # The LLM worker (workers/llm): generate, bench, write-random.
    cargo build --release -p llm-worker --features cuda
    cp "$TARGET/release/llm-worker" "$BIN/llm-worker"
    # The server's load generator (workers/llm-server/examples/serve_load.rs).
    cargo build --release -p llm-server --example serve_load
    cp "$TARGET/release/examples/serve_load" "$BIN/serve-load"
    # The Stable Diffusion worker (workers/sd).
    cargo build --release -p sd-worker --features cuda
    cp "$TARGET/release/sd-worker" "$BIN/sd-worker"
    cp "$TARGET/release/examples/qllama_e2e" "$BIN/bench-qllama-e2e"
    cargo build --release -p gguf-llama
    cp "$TARGET/release/gguf-llama" "$BIN/gguf-llama"
    # Python packages the peers need and the GPU machine lacks (openai, diffusers), and the
    # server's OpenAI-client smoke test.
    mkdir -p "$BIN/python"
    cp workers/llm-server/examples/openai_client.py "$BIN/python/"
    bash benches/python/fetch_wheels.sh "$BIN/wheels" || echo "no wheels (PyPI not reachable?): the openai and diffusers steps will skip"
    strip "$BIN"/bench-* "$BIN"/serve-load "$BIN"/llm-worker "$BIN"/sd-worker "$BIN"/gguf-llama 2>/dev/null || true
    du -sh "$BIN"
}

# candle-rocm's matmul loads cuBLAS at run time (cudarc looks for libcublas.so, .so.12,
# .so.11, ...: not .so.13). Puts the toolkit's libraries on the search path, links a
# libcublas.so to a versioned one when the toolkit has no unversioned name, and makes
# "cuBLAS did not load" a test failure (CANDLE_ROCM_REQUIRE_BLAS=1) instead of a skip.
cublas_setup() {
    local lib=/usr/local/cuda/lib64
    if [ -d "$lib" ]; then export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
    ls "$lib"/libcublas.so* 2>/dev/null || echo "no libcublas in $lib"
    if [ ! -e "$lib/libcublas.so" ] && ls "$lib"/libcublas.so.[0-9]* >/dev/null 2>&1; then
        local link; link="$(mktemp -d)"
        ln -s "$(ls "$lib"/libcublas.so.[0-9]* | head -1)" "$link/libcublas.so"
        export LD_LIBRARY_PATH="$link:$LD_LIBRARY_PATH"
        echo "linked $link/libcublas.so -> $(readlink "$link/libcublas.so")"
    fi
    export CANDLE_ROCM_REQUIRE_BLAS="${CANDLE_ROCM_REQUIRE_BLAS:-1}"
}

# kernel-collectives loads NCCL at run time: NCCL_LIBRARY names the file when set, else the
# loader looks for libnccl.so.2. The GPU machines have it from PyTorch's wheel
# (nvidia-nccl-cu*: site-packages/nvidia/nccl/lib/libnccl.so.2). With 2 or more GPUs a
# missing NCCL or GPU fails the collectives tests instead of skipping them.
nccl_setup() {
    if [ -z "${NCCL_LIBRARY:-}" ]; then
        local found
        found="$(python3 -c 'import glob, os, site, sys
dirs = []
try:
    import nvidia.nccl
    dirs += list(nvidia.nccl.__path__)
except Exception:
    pass
dirs += [os.path.join(d, "nvidia", "nccl") for d in site.getsitepackages() + [site.getusersitepackages()]]
for d in dirs:
    for f in glob.glob(os.path.join(d, "lib", "libnccl.so.2")):
        print(f); sys.exit()' 2>/dev/null || true)"
        if [ -n "$found" ]; then export NCCL_LIBRARY="$found"; fi
    fi
    echo "NCCL_LIBRARY=${NCCL_LIBRARY:-<unset: the loader looks for libnccl.so.2>}"
    # NVLink multicast (NVLS) stays off: the shared GPU machines require it.
    export NCCL_NVLS_ENABLE=0
    local gpus
    gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
    if [ "${gpus:-0}" -ge 2 ]; then export COLLECTIVES_REQUIRE_GPU="${COLLECTIVES_REQUIRE_GPU:-1}"; fi
}

# Installs the bundle's wheels of one set (benches/python/fetch_wheels.sh: openai, diffusers)
# into /tmp/py-SET once and prints that folder, for PYTHONPATH of the steps that need them;
# fails when the bundle has none.
py_site() {
    local dir="$BIN/wheels/$1" site="/tmp/py-$1"
    ls "$dir"/*.whl >/dev/null 2>&1 || return 1
    if [ ! -f "$site/.installed" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check --root-user-action=ignore \
            --upgrade --target "$site" "$dir"/*.whl >&2 || return 1
        touch "$site/.installed"
    fi
    echo "$site"
}

run() {
    if [ -d "$BIN/data" ]; then export KERNELS_TEST_DATA="$BIN/data"; fi
    cublas_setup
    nccl_setup
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    status=0
    if command -v ptxas >/dev/null && [ -f "$BIN/kernels.ptx" ]; then
        python3 "$BIN/ptxas_report.py" "$BIN/kernels.ptx" || status=1
    fi
    for t in "$BIN"/test-*; do
        echo "== $t"
        "$t" --test-threads=1 || status=1
    done
    exit $status
}

# One GPU call for everything a session reports: the tests on the GPU only, then each
# benchmark next to its peer in the same run (PyTorch; Candle's own CUDA backend when
# `candle-peer`, built by benches/candle-peer/build.sh, is in the bundle). Every step has
# its own time limit and its own log under DIR; `summary.txt` lists each step's exit code.
report() {
    local out="${1:?usage: nvidia.sh report DIR}"
    mkdir -p "$out"
    if [ -d "$BIN/data" ]; then export KERNELS_TEST_DATA="$BIN/data"; fi
    cublas_setup > "$out/cublas.txt" 2>&1
    nccl_setup > "$out/nccl.txt" 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1 || true
    step() { # step NAME SECONDS CMD...: runs CMD with a limit, logs to DIR/NAME.log
        local name="$1" limit="$2"; shift 2
        local rc=0
        timeout "$limit" "$@" > "$out/$name.log" 2>&1 || rc=$?
        echo "$name rc=$rc $(grep -E '^test result' "$out/$name.log" | tail -1)" | tee -a "$out/summary.txt"
    }
    # Parts to run (default: all). One `run` call has a 10-minute limit, so a session
    # splits the report over calls: `report DIR tests`, `report DIR llm quantized`, ...
    shift || true
    local parts="${*:-tests llm quantized matvec gemm conv attention e2e qe2e engine serve sd}"
    has() { case " $parts " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
    export CANDLE_ROCM_GPU_ONLY=1
    if has tests; then
        for t in "$BIN"/test-*; do
            step "$(basename "$t")" 180 "$t" --test-threads=1
        done
    fi
    local py="$BIN/python"
    mkdir -p "$out/llm" "$out/quantized" "$out/matvec" "$out/gemm" "$out/attention" "$out/e2e"
    if has llm; then
        step bench-llm 240 "$BIN/bench-llm" --out "$out/llm"
        step torch-llm 240 python3 "$py/torch_llm.py" --out "$out/llm"
        step report-llm 30 python3 "$py/report_llm.py" "$out/llm"
    fi
    if has quantized; then
        step bench-quantized 180 "$BIN/bench-quantized" --out "$out/quantized"
        step torch-quantized 120 python3 "$py/torch_quantized.py" --out "$out/quantized"
        if [ -x "$BIN/read-ceiling" ]; then
            local rc=0
            timeout 120 "$BIN/read-ceiling" > "$out/quantized/read_ceiling.txt" 2>&1 || rc=$?
            echo "read-ceiling rc=$rc" | tee -a "$out/summary.txt"
        fi
        if [ -x "$BIN/candle-peer" ]; then
            local rc=0
            timeout 180 "$BIN/candle-peer" qmatvec > "$out/quantized/candle_quantized.json" 2> "$out/candle-qmatvec.log" || rc=$?
            echo "candle-qmatvec rc=$rc" | tee -a "$out/summary.txt"
        fi
        step report-quantized 30 python3 "$py/report_quantized.py" "$out/quantized"
    fi
    if has matvec; then
        # Dense bf16/f16 decode matvecs (kernels::llm), every batch 1..8, against PyTorch's
        # F.linear (cuBLAS); the tables of % of copy are at the end of each log.
        step bench-dense-matvec 300 "$BIN/bench-dense_matvec" --out "$out/matvec"
        step torch-dense-matvec 270 python3 "$py/torch_dense_matvec.py" --out "$out/matvec"
        step report-dense-matvec 30 python3 "$py/report_dense_matvec.py" "$out/matvec"
    fi
    if has conv; then
        # 2-D convolution at the SD 1.5 layer shapes: the implicit-GEMM kernel, the im2col
        # path it replaces, and cuDNN through PyTorch (NCHW and channels-last).
        mkdir -p "$out/conv"
        step bench-conv 300 "$BIN/bench-conv" --out "$out/conv"
        step torch-conv 240 python3 "$py/torch_conv.py" --out "$out/conv"
        step report-conv 30 python3 "$py/report_conv.py" "$out/conv"
    fi
    if has gemm; then
        step bench-gemm 240 "$BIN/bench-gemm" --out "$out/gemm"
        step torch-gemm 240 python3 "$py/torch_gemm.py" --out "$out/gemm"
        # The mma.sync ceiling of a tuned library (benches/cuda/build-cutlass-peer.sh).
        if [ -x "$BIN/cutlass-sm80-gemm" ]; then
            local rc=0
            timeout 240 "$BIN/cutlass-sm80-gemm" > "$out/gemm/cutlass_gemm.jsonl" 2> "$out/cutlass-gemm.log" || rc=$?
            echo "cutlass-gemm rc=$rc" | tee -a "$out/summary.txt"
        fi
        step report-gemm 30 python3 "$py/report_gemm.py" "$out/gemm"
    fi
    if has attention; then
        # Prefill TFLOP/s against PyTorch SDPA (flash and cuDNN backends), paged decode GB/s
        # against SDPA over the gathered cache and the same run's copy bandwidth.
        step bench-attention 300 "$BIN/bench-attention_bench" --out "$out/attention"
        step torch-attention 300 python3 "$py/torch_attention.py" --out "$out/attention"
        step report-attention 30 python3 "$py/report_attention.py" "$out/attention"
    fi
    if has e2e; then
        if [ -x "$BIN/candle-peer" ]; then
            local rc=0
            timeout 240 "$BIN/candle-peer" --reps 5 > "$out/e2e/peer.jsonl" 2> "$out/e2e/peer.err" || rc=$?
            echo "e2e-peer rc=$rc" | tee -a "$out/summary.txt"
        fi
        step e2e-ours 300 "$BIN/bench-llama-e2e" --device cuda --reps 5 --profile "$out/e2e/profile"
        CANDLE_ROCM_BLAS=0 step e2e-ours-kernel-gemm 240 "$BIN/bench-llama-e2e" --device cuda --reps 3
        grep '^{' "$out/e2e-ours.log" > "$out/e2e/ours.jsonl" || true
        grep '^{' "$out/e2e-ours-kernel-gemm.log" > "$out/e2e/ours_kernel_gemm.jsonl" || true
        step report-e2e 30 python3 "$py/report_e2e.py" "$out/e2e/ours.jsonl" "$out/e2e/peer.jsonl" "$out/e2e/ours_kernel_gemm.jsonl"
    fi
    if has qe2e; then
        # GGUF llama, 8B shapes (Llama-3-8B: 32 layers, 4096 hidden, 14336 MLP, 128256
        # vocabulary), random weights written here by gguf-llama, on both backends.
        mkdir -p "$out/qe2e"
        for ty in ${QE2E_TYPES:-q4_0 q4k}; do
            local f="${QE2E_DIR:-/tmp}/llama8b_$ty.gguf"
            step "gguf-$ty" 300 "$BIN/gguf-llama" --out "$f" --type "$ty" --shape 8b
            if [ -x "$BIN/candle-peer" ]; then
                local rc=0
                timeout 240 "$BIN/candle-peer" qllama "$f" --reps 3 > "$out/qe2e/peer_$ty.jsonl" 2> "$out/qe2e/peer_$ty.err" || rc=$?
                echo "qe2e-peer-$ty rc=$rc" | tee -a "$out/summary.txt"
            fi
            step "qe2e-ours-$ty" 240 "$BIN/bench-qllama-e2e" "$f" --device cuda --reps 3
            grep '^{' "$out/qe2e-ours-$ty.log" > "$out/qe2e/ours_$ty.jsonl" || true
            step "report-qe2e-$ty" 30 python3 "$py/report_e2e.py" "$out/qe2e/ours_$ty.jsonl" "$out/qe2e/peer_$ty.jsonl"
            rm -f "$f"
        done
    fi
    if has engine; then
        # The serving engine (workers/llm) through `llm-worker bench` against its peers (issue
        # 30), on random-weight models written here: prompt 512, 256 generated tokens, greedy;
        # aggregate decode tokens/s and TTFT per concurrency (JSON lines in DIR/engine), then
        # report_engine.py builds DIR/engine/report_engine.csv from whatever ran.
        #   ENGINE_MODELS   which models (default "1b-bf16 8b-q4k 8b-bf16"; all three take
        #                   longer than one 10-minute call: split them over calls and run
        #                   report_engine.py on the union of the JSON lines)
        #   ENGINE_PEERS    which peers (default "torch torch-compile candle"): PyTorch eager
        #                   and torch.compile with a static cache (torch_engine.py, the same
        #                   folder through transformers), Candle's CUDA backend (candle-peer:
        #                   its candle-transformers llama at the 1B shapes, `qllama` on the
        #                   same GGUF file), batch 1
        mkdir -p "$out/engine"
        local d="${ENGINE_DIR:-/tmp}" e="$out/engine" m
        local peers=" ${ENGINE_PEERS:-torch torch-compile candle} "
        local modes=""
        case "$peers" in *" torch "*) modes="torch" ;; esac
        case "$peers" in *" torch-compile "*) modes="${modes:+$modes,}torch-compile" ;; esac
        step engine-copy 60 python3 "$py/torch_engine.py" copy --out "$e"
        for m in ${ENGINE_MODELS:-1b-bf16 8b-q4k 8b-bf16}; do
            local size="${m%%-*}" tag="${m//-/_}" conc
            case "$m" in
                1b-bf16|8b-bf16)
                    local dir="$d/llama${size}_bf16"
                    if [ "$size" = 1b ]; then conc="${ENGINE_CONCURRENCY:-1,8,32,64}"; else conc="${ENGINE_CONCURRENCY_8B_BF16:-1,8,32,64}"; fi
                    if [ ! -f "$dir/config.json" ]; then
                        step "engine-write-$size" 300 "$BIN/llm-worker" write-random --family llama --shape "$size" --dtype bf16 --out "$dir"
                    fi
                    step "engine-$m" 300 "$BIN/llm-worker" bench --model "$dir" --device cuda:0 --prompt-len 512 --gen 256 --concurrency "$conc"
                    grep '^{' "$out/engine-$m.log" > "$e/ours_$tag.jsonl" || true
                    if [ -n "$modes" ]; then
                        step "torch-engine-$m" 420 python3 "$py/torch_engine.py" --model "$dir" --tag "$m" --out "$e" \
                            --prompt-len 512 --gen 256 --concurrency "$conc" --modes "$modes" --reps "${ENGINE_TORCH_REPS:-2}"
                    fi
                    if [ "$size" = 1b ] && [ -x "$BIN/candle-peer" ] && [[ "$peers" == *" candle "* ]]; then
                        local rc=0
                        timeout 240 "$BIN/candle-peer" --prompt 512 --steps 256 --reps 3 > "$e/candle_$tag.jsonl" 2> "$out/engine-candle-$m.log" || rc=$?
                        echo "engine-candle-$m rc=$rc" | tee -a "$out/summary.txt"
                    fi
                    # The 8B folder is 16 GB: gone once measured (the 1B one stays for serve).
                    if [ "$size" = 8b ]; then rm -rf "$dir"; fi
                    ;;
                8b-q4k)
                    local f="$d/llama8b_q4k.gguf"
                    step engine-write-8b-q4k 300 "$BIN/llm-worker" write-random --family llama --shape 8b --gguf q4k --out "$f"
                    step engine-8b-q4k 300 "$BIN/llm-worker" bench --model "$f" --device cuda:0 \
                        --prompt-len 512 --gen 256 --concurrency "${ENGINE_CONCURRENCY_8B:-1,8}"
                    grep '^{' "$out/engine-8b-q4k.log" > "$e/ours_8b_q4k.jsonl" || true
                    if [ -x "$BIN/candle-peer" ] && [[ "$peers" == *" candle "* ]]; then
                        local rc=0
                        timeout 240 "$BIN/candle-peer" qllama "$f" --prompt 512 --steps 256 --reps 3 > "$e/candle_8b_q4k.jsonl" 2> "$out/engine-candle-8b-q4k.log" || rc=$?
                        echo "engine-candle-8b-q4k rc=$rc" | tee -a "$out/summary.txt"
                    fi
                    rm -f "$f"
                    ;;
                *) echo "engine: unknown model $m (1b-bf16, 8b-bf16, 8b-q4k)" | tee -a "$out/summary.txt" ;;
            esac
        done
        step report-engine 30 python3 "$py/report_engine.py" "$e"
    fi
    if has nccl; then
        # Collectives on two GPUs (nvidia-h100-x2): NCCL all-reduce/all-gather/broadcast of
        # our buffers against host sums, also inside a captured graph.
        step nccl-two-gpus 180 "$BIN/test-nccl_two_gpus" --test-threads=1
        # The engine's tensor-parallel forward (TP=2 against TP=1), issue 33.
        step tp-two-gpus 300 "$BIN/test-tp_gpu" --test-threads=1
    fi
    if has tp; then
        # Tensor parallelism's decode rate (issue 33): the 8B-shaped bf16 folder (random
        # weights, written here unless ENGINE_DIR has it), `llm-worker bench` at TP=1 on
        # cuda:0 and TP=2 on cuda:0-1, batch 1 and 64 sequences, prompt 512, 128 generated
        # tokens; JSON lines in DIR/tp/tp_8b_bf16.jsonl and the TP=2 / TP=1 ratios in
        # DIR/tp/summary.txt (target: >= 1.6x at batch 1).
        mkdir -p "$out/tp"
        local d="${ENGINE_DIR:-/tmp}" n
        local dir="$d/llama8b_bf16"
        if [ ! -f "$dir/config.json" ]; then
            step tp-write-8b 300 "$BIN/llm-worker" write-random --family llama --shape 8b --dtype bf16 --out "$dir"
        fi
        rm -f "$out/tp/tp_8b_bf16.jsonl"
        for n in 1 2; do
            step "tp-bench-tp$n" 180 "$BIN/llm-worker" bench --model "$dir" --device cuda:0 --tensor-parallel "$n" \
                --prompt-len 512 --gen 128 --concurrency "${TP_CONCURRENCY:-1,64}"
            grep '^{' "$out/tp-bench-tp$n.log" >> "$out/tp/tp_8b_bf16.jsonl" || true
        done
        python3 - "$out/tp/tp_8b_bf16.jsonl" > "$out/tp/summary.txt" 2>&1 <<'PY' || true
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r["tensor_parallel"], r["concurrency"]): r for r in rows}
for (tp, c), r in sorted(by.items()):
    print(f"TP={tp} concurrency {c}: decode {r['decode_tok_s']:.1f} tok/s, TTFT {r['ttft_ms']:.0f} ms, captured buckets {r.get('captured_buckets')}, {r['device']}")
for c in sorted({c for _, c in by}):
    if (1, c) in by and (2, c) in by:
        print(f"concurrency {c}: TP=2 / TP=1 decode = {by[(2, c)]['decode_tok_s'] / by[(1, c)]['decode_tok_s']:.2f}x")
PY
        cat "$out/tp/summary.txt" | tee -a "$out/summary.txt"
        if [ -z "${ENGINE_DIR:-}" ]; then rm -rf "$dir"; fi
    fi
    if has tpbig; then
        # The model larger than one 80 GB GPU (issue 33): the 48B-shaped bf16 folder (Llama
        # 70B's layers, 54 of them: 97 GB of random weights, written here; the 2-GPU machines'
        # disk holds it), TP=2 decode at batch 1 and 16, then `serve --tensor-parallel 2`
        # answering one chat completion; the folder is removed after.
        mkdir -p "$out/tpbig"
        local big="${ENGINE_DIR:-/tmp}/llama48b_bf16" bport=18090
        if [ ! -f "$big/config.json" ]; then
            step tpbig-write 480 "$BIN/llm-worker" write-random --family llama --shape 48b --dtype bf16 --out "$big"
        fi
        step tpbig-bench 300 "$BIN/llm-worker" bench --model "$big" --device cuda:0 --tensor-parallel 2 \
            --prompt-len 512 --gen 64 --concurrency "${TPBIG_CONCURRENCY:-1,16}"
        grep '^{' "$out/tpbig-bench.log" > "$out/tpbig/tp2_48b_bf16.jsonl" || true
        "$BIN/llm-worker" serve --model "$big" --device cuda:0 --tensor-parallel 2 --port $bport --served-model-name big > "$out/tpbig/server.log" 2>&1 &
        local bpid=$! ready=0
        for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$bport/health" >/dev/null 2>&1 && { ready=1; break; }; sleep 1; done
        if [ $ready = 1 ]; then
            curl -s -m 120 "http://127.0.0.1:$bport/v1/chat/completions" -H 'content-type: application/json' \
                -d '{"model":"big","messages":[{"role":"user","content":"Hello"}],"max_tokens":16,"seed":1}' > "$out/tpbig/chat.json" 2>&1
            echo "tpbig-serve ready, chat: $(head -c 300 "$out/tpbig/chat.json")" | tee -a "$out/summary.txt"
        else
            echo "tpbig-serve never became ready" | tee -a "$out/summary.txt"
        fi
        kill -TERM $bpid 2>/dev/null || true
        local brc=0; wait $bpid || brc=$?
        echo "tpbig-serve-shutdown rc=$brc" | tee -a "$out/summary.txt"
        if [ -z "${ENGINE_DIR:-}" ]; then rm -rf "$big"; fi
    fi
    if has serve; then
        # `llm-worker serve` (issue 31) per model, driven over loopback by the load generator
        # from light load to saturation, one serve-load process per rate (its own seed, so no
        # prompt is a prefix-cache hit of an earlier rate's; the same seed per rate in every
        # configuration, so they compare on the same prompts and arrivals) with /metrics
        # snapshotted after each rate (engine step and runner times per rate); then SIGTERM
        # (the exit status is the graceful-shutdown check); then the engine offline
        # (`llm-worker bench`) at the saturation concurrency (SERVE_REQUESTS, all at once,
        # the same prompt and output lengths): report_serve.py gives the ratio of the two.
        #   SERVE_MODELS     default "1b-bf16"; also 8b-bf16 (a 16 GB folder, removed after)
        #                    and 8b-q4k (a GGUF); all three do not fit one 10-minute call
        #   SERVE_RATES      requests/s, comma-separated (default 2,4,8,inf)
        #   SERVE_REQUESTS   requests per rate (default 48)
        #   SERVE_CHUNKS     --prefill-chunk-while-decoding values to measure beside the
        #                    default (cap 128, backlog 4) (default "0 256": no cap, and 256;
        #                    "" for none; C/W adds --prefill-cap-backlog W, e.g. "256/8";
        #                    LLM_PAGED_PREFILL=0 in the environment restores the gather path
        #                    of chunks with a cached prefix, LLM_MIXED_GRAPHS=0 runs steps
        #                    that mix prompts and decodes eagerly), each on a fresh server
        #                    at SERVE_CHUNK_RATES (default 2,4; the 1B saturates near 78 req/s
        #                    on an H200, so 40 is about half)
        local d="${ENGINE_DIR:-/tmp}" port=18080 sv="$out/serve" m
        mkdir -p "$sv"
        local reqs="${SERVE_REQUESTS:-48}" rates="${SERVE_RATES:-2,4,8,inf}"
        serve_up() { # serve_up LOG MODEL EXTRA...: starts the server, waits for /health
            local log="$1" model="$2"; shift 2
            "$BIN/llm-worker" serve --model "$model" --device cuda:0 --port $port --served-model-name served \
                --max-num-seqs "${SERVE_MAX_NUM_SEQS:-64}" "$@" > "$log" 2>&1 &
            serve_pid=$!
            for _ in $(seq 1 240); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0; sleep 1; done
            echo "serve: $model never became ready" | tee -a "$out/summary.txt"
        }
        serve_down() { # serve_down NAME: SIGTERM, the exit status into the summary
            kill -TERM "$serve_pid" 2>/dev/null || true
            local rc=0
            wait "$serve_pid" || rc=$?
            echo "$1 rc=$rc" | tee -a "$out/summary.txt"
        }
        serve_rates() { # serve_rates TAG RATES: one serve-load per rate, metrics after each
            local tag="$1" r
            curl -s "http://127.0.0.1:$port/metrics" > "$sv/metrics_${tag}_start.txt" 2>&1 || true
            for r in ${2//,/ }; do
                local seed; seed="$(echo "rate-$r" | cksum | cut -d' ' -f1)"
                timeout 300 "$BIN/serve-load" --url "http://127.0.0.1:$port" --model served --rates "$r" --seed "$seed" \
                    --requests "$reqs" --prompt-len 512 --max-tokens 256 --vocab 128000 >> "$out/serve-load-$tag.log" 2>&1 \
                    || echo "serve-load $tag rate $r rc=$?" | tee -a "$out/summary.txt"
                curl -s "http://127.0.0.1:$port/metrics" > "$sv/metrics_${tag}_rate_$r.txt" 2>&1 || true
            done
            grep '^{' "$out/serve-load-$tag.log" > "$sv/load_$tag.jsonl" || true
            echo "serve-load-$tag $(wc -l < "$sv/load_$tag.jsonl") rates" | tee -a "$out/summary.txt"
        }
        for m in ${SERVE_MODELS:-1b-bf16}; do
            local size="${m%%-*}" tag="${m//-/_}" path
            case "$m" in
                1b-bf16|8b-bf16)
                    path="$d/llama${size}_bf16"
                    if [ ! -f "$path/config.json" ]; then
                        step "serve-write-$m" 300 "$BIN/llm-worker" write-random --family llama --shape "$size" --dtype bf16 --out "$path"
                    fi ;;
                8b-q4k)
                    path="$d/llama8b_q4k.gguf"
                    if [ ! -f "$path" ]; then
                        step serve-write-8b-q4k 300 "$BIN/llm-worker" write-random --family llama --shape 8b --gguf q4k --out "$path"
                    fi ;;
                *) echo "serve: unknown model $m (1b-bf16, 8b-bf16, 8b-q4k)" | tee -a "$out/summary.txt"; continue ;;
            esac
            serve_up "$sv/server_$tag.log" "$path"
            if [ "$m" = 1b-bf16 ]; then
                # The official `openai` client (wheels in the bundle) against the idle server:
                # streamed chat timed as a client sees it (and checked against the whole
                # answer), then the API smoke test.
                local site
                if site="$(py_site openai)"; then
                    step serve-openai-stream 120 env PYTHONPATH="$site" python3 "$py/openai_stream.py" \
                        --base-url "http://127.0.0.1:$port/v1" --max-tokens 64 --out "$sv"
                    step serve-openai-client 120 env PYTHONPATH="$site" python3 "$py/openai_client.py" "http://127.0.0.1:$port/v1"
                else
                    echo "serve-openai skipped: no openai wheels in the bundle" | tee -a "$out/summary.txt"
                fi
            fi
            serve_rates "$tag" "$rates"
            serve_down "serve-shutdown-$tag"
            step "serve-offline-$m" 300 "$BIN/llm-worker" bench --model "$path" --device cuda:0 \
                --prompt-len 512 --gen 256 --concurrency "$reqs"
            grep '^{' "$out/serve-offline-$m.log" > "$sv/offline_$tag.jsonl" || true
            local c
            for c in ${SERVE_CHUNKS-0 256}; do
                # C, or C/W: cap C lifted while more than W requests wait (--prefill-cap-backlog).
                local ctag="chunk${c/\//w}" extra=(--prefill-chunk-while-decoding "${c%%/*}")
                if [[ "$c" == */* ]]; then extra+=(--prefill-cap-backlog "${c#*/}"); fi
                serve_up "$sv/server_${tag}_$ctag.log" "$path" "${extra[@]}"
                serve_rates "${tag}_$ctag" "${SERVE_CHUNK_RATES:-2,4}"
                serve_down "serve-shutdown-${tag}_$ctag"
            done
            if [ "$m" = 8b-bf16 ]; then rm -rf "$path"; fi
            if [ "$m" = 8b-q4k ]; then rm -f "$path"; fi
        done
        step report-serve 30 python3 "$py/report_serve.py" "$sv"
    fi
    if has sd; then
        # Stable Diffusion (workers/sd, issue 32): UNet step (batch 2, classifier-free guidance)
        # and VAE decode at the SD 1.5 (512x512) and SDXL (1024x1024) shapes, random weights,
        # f16; the peers are diffusers on PyTorch (torch_sd.py: the same networks built from the
        # published configurations, SDPA attention) and Candle's CUDA backend (`candle-peer
        # sd`: candle-transformers' UNet and VAE); report_sd.py builds DIR/sd/report_sd.csv.
        mkdir -p "$out/sd"
        local s shapes="${SD_SHAPES:-sd15 sdxl}"
        for s in $shapes; do
            step "$s-f16" 300 "$BIN/sd-worker" bench --shape "$s" --steps 5 --device cuda:0 --dtype f16
            grep '^{' "$out/$s-f16.log" > "$out/sd/ours_${s}_f16.jsonl" || true
        done
        # The same UNet step with every 3x3 convolution on our implicit-GEMM kernel instead
        # of im2col + cuBLAS (report row "ours-implicit"); SD_IMPLICIT_SHAPES (default sd15).
        for s in ${SD_IMPLICIT_SHAPES-sd15}; do
            CANDLE_ROCM_CONV=implicit step "$s-f16-implicit" 240 "$BIN/sd-worker" bench --shape "$s" --steps 5 --device cuda:0 --dtype f16
            grep '^{' "$out/$s-f16-implicit.log" > "$out/sd/ours-implicit_${s}_f16.jsonl" || true
        done
        local site=""
        if site="$(py_site diffusers)" || python3 -c 'import diffusers' 2>/dev/null; then
            step torch-sd 300 env PYTHONPATH="$site" python3 "$py/torch_sd.py" --out "$out/sd" --shapes "${shapes// /,}" --steps 5
        else
            echo "torch-sd skipped: no diffusers (wheels or installed)" | tee -a "$out/summary.txt"
        fi
        if [ -x "$BIN/candle-peer" ]; then
            for s in $shapes; do
                step "candle-sd-$s" 180 "$BIN/candle-peer" sd --shape "$s" --steps 5
                grep '^{' "$out/candle-sd-$s.log" > "$out/sd/candle_$s.jsonl" || true
            done
        else
            echo "candle-sd skipped: no candle-peer in $BIN (benches/candle-peer/build.sh)" | tee -a "$out/summary.txt"
        fi
        step report-sd 30 python3 "$py/report_sd.py" "$out/sd"
    fi
}

pack() {
    local dir="${1:?usage: nvidia.sh pack DIR}"
    mkdir -p "$dir"
    # One stream with a dictionary larger than a binary: the PTX every binary embeds is
    # stored once (417 MB -> 18 MB).
    tar -cf - "$BIN" | xz --lzma2=preset=3,dict=256MiB -T1 > "$dir/bundle.tar.xz"
    du -h "$dir/bundle.tar.xz"
}

case "${1:-all}" in
    bundle) bundle ;;
    bundle-tests) rm -rf "$BIN"; bundle_tests; du -sh "$BIN" ;;
    pack) pack "${2:-}" ;;
    run) run ;;
    report) shift; report "$@" ;;
    all) nccl_setup; cargo test -p kernels -p candle-rocm -p attention -p kernel-collectives --features kernels/cuda,candle-rocm/cuda,attention/cuda,kernel-collectives/cuda -- --test-threads=1 ;;
    *) echo "usage: $0 [bundle|bundle-tests|pack DIR|run|report DIR]" >&2; exit 2 ;;
esac
