#!/usr/bin/env bash
# Installs Debian's Chromium (package `chromium`) for the dashboard's end-to-end test, which
# renders /dashboard in headless Chromium and checks its screenshot. Idempotent: returns at
# once when it is there. Prints the browser's path.
set -euo pipefail
if ! command -v chromium >/dev/null; then
    exec 9>"${TMPDIR:-/tmp}/tokenmill-browser-deps.lock"
    flock 9
    if ! command -v chromium >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2
        apt-get install -y -qq --no-install-recommends chromium >&2
    fi
fi
command -v chromium
