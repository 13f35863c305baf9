#!/usr/bin/env bash
# Installs EleutherAI's lm-evaluation-harness (`lm-eval[api]`, pinned; no torch: the `api`
# extra talks to a server over HTTP) into a git-ignored virtual environment at .venv-lmeval/,
# for the end-to-end test that runs it against `tokenmill serve` and for
# scripts/quant-quality.sh. Idempotent: returns at once when the venv has that version.
# Prints the venv's python.
set -euo pipefail
cd "$(dirname "$0")/.."

LM_EVAL_VERSION=0.4.13
VENV=.venv-lmeval
PY="$VENV/bin/python"

ready() {
    [ -x "$PY" ] && "$PY" - "$LM_EVAL_VERSION" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
sys.exit(version("lm_eval") != sys.argv[1])
PY
}

if ready; then
    echo "$PWD/$PY"
    exit 0
fi
# Two tests may ask at the same moment: one installer at a time.
exec 9>"${TMPDIR:-/tmp}/tokenmill-lm-eval-deps.lock"
flock 9
if ! ready; then
    [ -x "$PY" ] || python3 -m venv "$VENV" >&2
    "$PY" -m pip install --quiet --disable-pip-version-check "lm-eval[api]==$LM_EVAL_VERSION" >&2
fi
echo "$PWD/$PY"
