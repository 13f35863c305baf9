#!/usr/bin/env bash
# Builds the llama.cpp peer from the llama-cpp-python source distribution on PyPI (the only
# registry this project's machines reach) into a cache folder outside the checkout, and prints
# the folder holding the binaries. Used by the benchmark scripts (side-by-side runs) and by the
# tests that check llama.cpp loads what `tokenmill quantize` writes. Idempotent: returns at
# once when the binaries are there.
# Usage: scripts/llama-cpp-peer.sh [TARGET...]   (default: llama-server llama-bench llama-batched-bench)
# Env:   PEER_CACHE (default ~/.cache/tokenmill-peers), LLAMA_CPP_PY_VERSION (default 0.3.36)
set -euo pipefail
ver="${LLAMA_CPP_PY_VERSION:-0.3.36}"
cache="${PEER_CACHE:-$HOME/.cache/tokenmill-peers}"
src="$cache/llama_cpp_python-$ver/vendor/llama.cpp"
bin="$src/build/bin"
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(llama-server llama-bench llama-batched-bench)
missing=()
for t in "${targets[@]}"; do [ -x "$bin/$t" ] || missing+=("$t"); done
if [ ${#missing[@]} -eq 0 ]; then echo "$bin"; exit 0; fi
mkdir -p "$cache"
# One builder at a time (tests may ask together).
exec 9>"$cache/.build.lock"
flock 9
command -v cmake >/dev/null || { apt-get update -qq >&2 && apt-get install -y -qq cmake >&2; }
if [ ! -d "$src" ]; then
  tmp=$(mktemp -d)
  # pip only downloads the source distribution (its metadata step needs the build backend);
  # cmake builds it below.
  python3 -m pip install -q scikit-build-core >&2
  python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation -d "$tmp" \
    "llama-cpp-python==$ver" >&2
  tar xzf "$tmp"/llama_cpp_python-"$ver".tar.gz -C "$cache"
  rm -rf "$tmp"
fi
cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >&2
cmake --build "$src/build" -j"$(nproc)" --target "${missing[@]}" >&2
echo "$bin"
