#!/usr/bin/env bash
# Installs what the end-to-end tests need beyond cargo: the official `openai` Python client,
# `jsonschema` (which checks structured outputs against their schemas), `pyzmq` + `msgpack`
# (an independent subscriber to the KV-cache events) and `opentelemetry-proto` (an independent
# OTLP/HTTP receiver of the traces), pinned, in a
# git-ignored virtual environment at .venv-test/. Idempotent: returns at once when the venv
# already has those versions. Prints the venv's python.
set -euo pipefail
cd "$(dirname "$0")/.."

OPENAI_VERSION=3.51.0
JSONSCHEMA_VERSION=4.26.0
PYZMQ_VERSION=27.3.0
MSGPACK_VERSION=1.2.4
OTEL_PROTO_VERSION=1.45.2
VENV=.venv-test
PY="$VENV/bin/python"

ready() {
    [ -x "$PY" ] && "$PY" - "$OPENAI_VERSION" "$JSONSCHEMA_VERSION" "$PYZMQ_VERSION" \
        "$MSGPACK_VERSION" "$OTEL_PROTO_VERSION" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
want = dict(zip(["openai", "jsonschema", "pyzmq", "msgpack", "opentelemetry-proto"], sys.argv[1:]))
sys.exit(not all(version(p) == v for p, v in want.items()))
PY
}

if ready; then
    echo "$PWD/$PY"
    exit 0
fi
# Another test may be installing at the same moment: one installer at a time.
exec 9>"${TMPDIR:-/tmp}/tokenmill-test-deps.lock"
flock 9
if ! ready; then
    [ -x "$PY" ] || python3 -m venv "$VENV" >&2
    "$PY" -m pip install --quiet --disable-pip-version-check \
        "openai==$OPENAI_VERSION" "jsonschema==$JSONSCHEMA_VERSION" \
        "pyzmq==$PYZMQ_VERSION" "msgpack==$MSGPACK_VERSION" \
        "opentelemetry-proto==$OTEL_PROTO_VERSION" >&2
fi
echo "$PWD/$PY"
