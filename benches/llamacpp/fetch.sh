#!/usr/bin/env bash
# Fetches what benches/llamacpp/run.sh needs on the NVIDIA machine (which has no network):
# llama.cpp's source as vendored by the `llama-cpp-sys-2` crate (crates.io), and PyPI's
# cmake and ninja wheels in case the machine lacks them.   usage: fetch.sh DEST
set -euo pipefail
DEST="${1:?usage: fetch.sh DEST}"; VER="${LLAMA_CPP_SYS_VERSION:-0.1.161}"
mkdir -p "$DEST"
curl -sfL -o "$DEST/llama-cpp-sys-2-$VER.crate" "https://static.crates.io/crates/llama-cpp-sys-2/llama-cpp-sys-2-$VER.crate"
python3 -m pip download -q --disable-pip-version-check --only-binary=:all: --no-deps \
    --platform manylinux2014_x86_64 --python-version 3.12 -d "$DEST" cmake==4.4.5 ninja==1.13.2
ls -la "$DEST"
