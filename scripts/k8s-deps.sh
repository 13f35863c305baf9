#!/usr/bin/env bash
# Installs `kubernetes-validate` (the Kubernetes OpenAPI schemas of each release, bundled: it
# validates offline) in a git-ignored virtual environment at .venv-k8s/, for the test of the
# manifests in deploy/k8s. Idempotent. Prints the path of its `kubernetes-validate`.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=1.31.0
VENV=.venv-k8s
BIN="$VENV/bin/kubernetes-validate"
ready() { [ -x "$BIN" ] && [ "$("$BIN" --version 2>/dev/null)" = "$VERSION" ]; }
if ! ready; then
    exec 9>"${TMPDIR:-/tmp}/tokenmill-k8s-deps.lock"
    flock 9
    if ! ready; then
        [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >&2
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            "kubernetes-validate==$VERSION" >&2
    fi
fi
echo "$PWD/$BIN"
