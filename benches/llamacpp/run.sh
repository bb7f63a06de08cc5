#!/usr/bin/env bash
# llama.cpp's CUDA backend as the engine benchmark's GGUF peer, built and run on the NVIDIA
# machine (it has CUDA 13 and nvcc; this machine has no GPU, and building ggml-cuda on 2
# cores takes hours). The source is llama.cpp as vendored by the `llama-cpp-sys-2` crate
# (fetched from crates.io by `fetch.sh`; the crate ships the library, not llama.cpp's tools), built
# for sm_90 only, with `bench.cpp` (our batch-1 bench on llama.h) on top.
#
# usage: run.sh PACK MODEL.gguf OUT_DIR TAG
#   PACK: folder from fetch.sh (llama-cpp-sys-2-*.crate, cmake/ninja wheels)
#   Writes OUT_DIR/llamacpp_TAG.jsonl (read by benches/python/report_engine.py), the raw
#   bench lines (llamacpp_raw_TAG.jsonl) and the build and bench logs.
# Measures, with flash attention on and every layer on the GPU, 3 timed repetitions (after one
# warm-up) of: prefill of 512 tokens (time to first token), then 256 greedy tokens one by one
# (batch-1 decode), the shape of `llm-worker bench --prompt-len 512 --gen 256`.
set -euo pipefail
PACK="$(cd "$1" && pwd)"; MODEL="$2"; OUT="$3"; TAG="$4"
mkdir -p "$OUT"; OUT="$(cd "$OUT" && pwd)"
W=/tmp/llamacpp; rm -rf "$W"; mkdir -p "$W"
tar -xzf "$PACK"/llama-cpp-sys-2-*.crate -C "$W"
SRC="$(ls -d "$W"/llama-cpp-sys-2-*/llama.cpp)"
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
    python3 -m pip install -q --no-index --target "$W/py" "$PACK"/cmake-*.whl "$PACK"/ninja-*.whl
    export PATH="$W/py/bin:$PATH" PYTHONPATH="$W/py${PYTHONPATH:+:$PYTHONPATH}"
fi
export PATH="/usr/local/cuda/bin:$PATH"
{ cmake --version | head -1; nvcc --version | tail -1; } | tee "$OUT/llamacpp_build_$TAG.log"
HERE="$(cd "$(dirname "$0")" && pwd)"
s=$(date +%s)
cmake -S "$HERE" -B "$W/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_SRC="$SRC" -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON >> "$OUT/llamacpp_build_$TAG.log" 2>&1
cmake --build "$W/build" --target llamacpp-bench -j "$(nproc)" >> "$OUT/llamacpp_build_$TAG.log" 2>&1
echo "built in $(( $(date +%s) - s )) s" | tee -a "$OUT/llamacpp_build_$TAG.log"
"$W/build/llamacpp-bench" "$MODEL" 512 256 3 > "$OUT/llamacpp_raw_$TAG.jsonl" 2> "$OUT/llamacpp_bench_$TAG.log"
python3 - "$OUT/llamacpp_raw_$TAG.jsonl" "$OUT/llamacpp_$TAG.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
if not rows:
    sys.exit("llama.cpp bench produced no rows (see llamacpp_bench_*.log)")
out = {"concurrency": 1, "prompt_len": rows[0]["prompt_len"], "gen": rows[0]["gen"], "reps": len(rows),
       "decode_tok_s": statistics.median(r["decode_tok_s"] for r in rows),
       "ttft_ms": statistics.median(r["ttft_ms"] for r in rows)}
open(sys.argv[2], "w").write(json.dumps(out) + "\n")
print("llama.cpp:", out)
PY
