#!/usr/bin/env bash
# Runs every test of tokenmill on a fresh machine: fetches the default model and the test
# dependencies (the `openai` Python client in .venv-test/), checks
# formatting and lints, then runs the whole workspace's tests (golden tests on the real
# model included). CI (`.ci/run`) calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh >/dev/null
scripts/test-deps.sh >/dev/null   # the official openai client, for the end-to-end tests
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
