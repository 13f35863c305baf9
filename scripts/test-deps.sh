#!/usr/bin/env bash
# Installs what the end-to-end tests need beyond cargo: the official `openai` Python client,
# pinned, in a git-ignored virtual environment at .venv-test/. Idempotent: returns at once
# when the venv already has that version. Prints the venv's python.
set -euo pipefail
cd "$(dirname "$0")/.."

OPENAI_VERSION=3.51.0
VENV=.venv-test
PY="$VENV/bin/python"

if [ -x "$PY" ] && "$PY" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
    echo "$PWD/$PY"
    exit 0
fi
# Another test may be installing at the same moment: one installer at a time.
exec 9>"${TMPDIR:-/tmp}/tokenmill-test-deps.lock"
flock 9
if ! [ -x "$PY" ] || ! "$PY" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
    python3 -m venv "$VENV" >&2
    "$PY" -m pip install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION" >&2
fi
echo "$PWD/$PY"
