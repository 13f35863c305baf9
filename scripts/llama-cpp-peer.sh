#!/usr/bin/env bash
# Builds the llama.cpp peer from the llama-cpp-python source distribution on PyPI (the only
# registry this project's machines reach) into a cache folder outside the checkout, and prints
# the folder holding the binaries. Used by the benchmark scripts (side-by-side runs) and by the
# tests that check llama.cpp loads what `tokenmill quantize` writes. Idempotent: returns at
# once when the binaries are there.
#
# AMX is compiled out. With GGML_NATIVE=ON on a CPU that has AMX (amx_tile/amx_int8/amx_bf16 in
# /proc/cpuinfo), -march=native compiles ggml's AMX matmul, and on this project's AMX machines
# that kernel dies with SIGILL at its first `tileloadd` (llama-bench pp512; llama-server's
# warm-up, so the server never becomes ready). `-mno-amx-*` keeps the rest of -march=native:
# llama.cpp's AVX-512 VNNI path, the fastest llama.cpp that runs here. The build folder's name
# carries a hash of the build flags, so a machine that holds a build made with other flags (the
# crashing one) builds afresh instead of reusing it.
#
# Usage: scripts/llama-cpp-peer.sh [TARGET...]   (default: llama-server llama-bench llama-batched-bench)
#        scripts/llama-cpp-peer.sh --where       (prints the binaries' folder; builds nothing)
# Env:   PEER_CACHE (default ~/.cache/tokenmill-peers), LLAMA_CPP_PY_VERSION (default 0.3.36)
set -euo pipefail
ver="${LLAMA_CPP_PY_VERSION:-0.3.36}"
cache="${PEER_CACHE:-$HOME/.cache/tokenmill-peers}"
src="$cache/llama_cpp_python-$ver/vendor/llama.cpp"
noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
flags=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON
  "-DCMAKE_C_FLAGS=$noamx" "-DCMAKE_CXX_FLAGS=$noamx"
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON)
tag=$(printf '%s\n' "${flags[@]}" | sha256sum | cut -c1-12)
build="$src/build-noamx-$tag"
bin="$build/bin"
if [ "${1:-}" = "--where" ]; then echo "$bin"; exit 0; fi
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
cmake -S "$src" -B "$build" "${flags[@]}" >&2
cmake --build "$build" -j"$(nproc)" --target "${missing[@]}" >&2
# The point of the flags: no tile instruction may be left in ggml's CPU backend.
if command -v objdump >/dev/null && [ -f "$bin/libggml-cpu.so" ]; then
  n=$(objdump -d "$bin/libggml-cpu.so" | grep -c tileloadd || true)
  [ "$n" = 0 ] || { echo "error: $bin/libggml-cpu.so still has $n tileloadd (AMX not compiled out)" >&2; exit 1; }
fi
echo "$bin"
