#!/usr/bin/env bash
# Installs Debian's Prometheus (package `prometheus`: the server and `promtool`) for the tests
# of deploy/prometheus (rules checked and unit-tested by promtool; a real Prometheus scraping
# two workers). Idempotent: returns at once when both are there. Prints the folder holding
# the two binaries.
set -euo pipefail
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
    exec 9>"${TMPDIR:-/tmp}/tokenmill-prometheus-deps.lock"
    flock 9
    if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2
        apt-get install -y -qq --no-install-recommends prometheus >&2
    fi
fi
dirname "$(command -v promtool)"
