#!/usr/bin/env bash
# Prints the tokenmill binary the bench scripts run: $TOKENMILL_BIN if set, else
# target/release/tokenmill, built (quietly) first.
set -euo pipefail
if [ -n "${TOKENMILL_BIN:-}" ]; then
  echo "$TOKENMILL_BIN"
  exit 0
fi
cd "$(dirname "$0")/.."
cargo build --release -q -p tokenmill >&2
echo "$PWD/target/release/tokenmill"
