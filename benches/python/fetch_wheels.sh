#!/usr/bin/env bash
# Wheels of the Python packages that the peers of `nvidia.sh report` need and the GPU machine
# lacks (it has PyTorch, transformers, huggingface-hub, safetensors, but no network), for its
# Python (CPython 3.12, x86-64 Linux). `nvidia.sh bundle` puts them in .device-bin/wheels/;
# on the GPU machine `nvidia.sh report` installs each set into its own /tmp/py-SET and puts it
# on PYTHONPATH for the steps that use it only, so nothing the machine has is shadowed
# elsewhere.
#
#   openai/     the official client (the serve part's streaming check) with its whole
#               dependency closure (pydantic, its compiled core, jiter, httpx2, ...)
#   diffusers/  diffusers (the sd part's peer), no dependencies but importlib_metadata and
#               zipp: numpy, safetensors, huggingface-hub, Pillow, regex, requests are there
#
# usage: benches/python/fetch_wheels.sh DEST   (needs PyPI; about 15 MB)
set -euo pipefail
DEST="${1:?usage: fetch_wheels.sh DEST}"
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp
          --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
fetch() { # fetch SET PIP-ARGS...: a fresh DEST/SET (one version of each package)
    local set="$1"; shift
    rm -rf "${DEST:?}/$set" && mkdir -p "$DEST/$set"
    python3 -m pip download -q --disable-pip-version-check "${PLATFORM[@]}" -d "$DEST/$set" "$@"
    echo "wheels $set: $(cd "$DEST/$set" && ls | tr '\n' ' ')"
}
fetch openai openai==3.57.0
fetch diffusers --no-deps diffusers==0.42.1 importlib_metadata==10.2.0 zipp==4.1.2
du -sh "$DEST"
