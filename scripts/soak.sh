#!/usr/bin/env bash
# Soak test of `tokenmill serve` under faults (issue 21): mixed traffic, disconnects, malformed
# requests, slow-loris connections, fault waves with idle/KV checks, an RSS check, a SIGTERM
# drain and a restart. Starts its own server (binary: $TOKENMILL_BIN, else scripts/tokenmill-bin.sh)
# on the default model (scripts/fetch-model.sh).
# Usage: scripts/soak.sh [--duration 300] [--port P] [--seed S] [--clients N] [--json-out F] ...
#   (every option of scripts/soak.py; CI: scripts/soak.sh --duration 60)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$("$here/tokenmill-bin.sh")"
model="$("$here/fetch-model.sh")"
exec python3 "$here/soak.py" --bin "$bin" --model "$model" "$@"
