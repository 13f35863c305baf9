#!/usr/bin/env bash
# Installs the gateways the scale-out test puts in front of tokenmill workers, from PyPI,
# pinned, in a git-ignored virtual environment at .venv-gateway/: SGLang's model gateway (`smg`)
# and `vllm-router`. Idempotent. Prints the folder holding their commands.
set -euo pipefail
cd "$(dirname "$0")/.."
SMG_VERSION=1.13.0
VLLM_ROUTER_VERSION=0.1.17
VENV=.venv-gateway
PY="$VENV/bin/python"
ready() {
    [ -x "$PY" ] && "$PY" - "$SMG_VERSION" "$VLLM_ROUTER_VERSION" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
sys.exit(not (version("smg") == sys.argv[1] and version("vllm-router") == sys.argv[2]))
PY
}
if ! ready; then
    exec 9>"${TMPDIR:-/tmp}/tokenmill-gateway-deps.lock"
    flock 9
    if ! ready; then
        [ -x "$PY" ] || python3 -m venv "$VENV" >&2
        "$PY" -m pip install --quiet --disable-pip-version-check \
            "smg==$SMG_VERSION" "vllm-router==$VLLM_ROUTER_VERSION" >&2
    fi
fi
echo "$PWD/$VENV/bin"
