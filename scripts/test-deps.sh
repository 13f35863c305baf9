#!/usr/bin/env bash
# Installs what the end-to-end tests need beyond cargo: the official `openai` Python client
# and `jsonschema` (which checks structured outputs against their schemas), pinned, in a
# git-ignored virtual environment at .venv-test/. Idempotent: returns at once when the venv
# already has those versions. Prints the venv's python.
set -euo pipefail
cd "$(dirname "$0")/.."

OPENAI_VERSION=3.51.0
JSONSCHEMA_VERSION=4.26.0
VENV=.venv-test
PY="$VENV/bin/python"

ready() {
    [ -x "$PY" ] && "$PY" - "$OPENAI_VERSION" "$JSONSCHEMA_VERSION" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
sys.exit(not (version("openai") == sys.argv[1] and version("jsonschema") == sys.argv[2]))
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
        "openai==$OPENAI_VERSION" "jsonschema==$JSONSCHEMA_VERSION" >&2
fi
echo "$PWD/$PY"
