#!/usr/bin/env bash
# Runs tokenmill's memory-safety-sensitive code under Miri (issue 21): the GGUF reader's unit
# tests (bounded reads, placement and overlap checks, the writer), the safetensors reader's
# hostile-file tests, and the kernels' unit tests that go through `unsafe` — the thread pool
# splitting outputs across workers, the matmul planner, unaligned block casts, the paged KV
# writes. Under Miri feature detection reports no SIMD, so the dispatch table is the scalar
# (reference) tier; the SIMD tiers are covered by their differential tests and by the
# AddressSanitizer builds of the fuzz targets (scripts/fuzz.sh). Miri cannot map files, so
# tests that open files on disk are left to the normal test run.
#
# Usage: scripts/miri.sh [quick|full]   (quick: the subset CI runs, a few minutes; full: every
# unit test of the three crates, much longer)
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-quick}"
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "SKIPPED miri: no nightly toolchain"
  exit 0
fi
if ! cargo +nightly miri --version >/dev/null 2>&1; then
  if ! rustup component add --toolchain nightly miri rust-src >&2; then
    echo "SKIPPED miri: the miri component could not be installed"
    exit 0
  fi
fi
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation}"
miri() { cargo +nightly miri test --locked "$@"; }
if [ "$mode" = full ]; then
  miri -p tokenmill-gguf --lib
  miri -p tokenmill-safetensors --test hostile
  miri -p tokenmill-kernels --lib
  miri -p tokenmill-kernels --test pool
else
  miri -p tokenmill-gguf --lib -- reader:: tensor:: file::
  miri -p tokenmill-safetensors --test hostile -- header_ entry_ tiling_ duplicate_
  miri -p tokenmill-kernels --lib -- matmul:: blocks:: paged:: par_write::
  # The pool's claim/wake/join protocol across threads; the 10,007-task sweep is full-only.
  miri -p tokenmill-kernels --test pool -- --skip every_index_exactly_once_on_any_thread_count
fi
echo "miri: ok ($mode)"
