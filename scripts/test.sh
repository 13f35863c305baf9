#!/usr/bin/env bash
# Runs every test of tokenmill on a fresh machine: fetches the default model and the test
# dependencies (the `openai` Python client in .venv-test/, the llama.cpp peer), checks
# formatting and lints, runs the whole workspace's tests (golden tests on the real model
# included), then the soak, the fuzz targets and Miri. CI (`.ci/run`) calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
# A test run builds from scratch, so incremental caches only cost disk (2 GB of target/).
export CARGO_INCREMENTAL=0
# TOKENMILL_CI_LOW_DISK=1 (set by .ci/run): drop each stage's build once the next stage no
# longer needs it, so the run's peak disk is one stage's build (a CI machine once ran out of
# space at ~9 GB: the test build, the fuzz build and Miri's side by side).
low_disk() { [ "${TOKENMILL_CI_LOW_DISK:-0}" = 1 ]; }
scripts/fetch-model.sh >/dev/null
scripts/test-deps.sh >/dev/null   # the official openai client, for the end-to-end tests
# llama.cpp (built once from PyPI's llama-cpp-python sources into ~/.cache): the quantize tests
# check that it loads what `tokenmill quantize` writes and agrees with tokenmill; the perplexity
# test checks `tokenmill perplexity` against llama-perplexity.
LLAMA_CPP_BIN="$(scripts/llama-cpp-peer.sh llama-server llama-quantize llama-perplexity)"
export LLAMA_CPP_BIN TOKENMILL_REQUIRE_PEER=1
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# --no-fail-fast: one failing test binary must not hide the state of the others (the
# command still exits non-zero on any failure).
cargo test --workspace --locked --no-fail-fast
# The reliability campaign (issue 21, RELIABILITY.md), on what the tests just built: a minute of
# mixed traffic under faults against `tokenmill serve`, every fuzz target for a bounded time
# (nightly + cargo-fuzz, AddressSanitizer), and the readers' and kernels' unsafe paths under Miri.
TOKENMILL_BIN="$PWD/target/debug/tokenmill" scripts/soak.sh --duration 60
if low_disk; then rm -rf target/debug; fi
FUZZ_SECONDS="${FUZZ_SECONDS:-60}" scripts/fuzz.sh
if low_disk; then rm -rf fuzz/target; fi
scripts/miri.sh quick
