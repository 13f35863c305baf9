#!/usr/bin/env bash
# Makes the DeepSeek-V2-Lite-shaped benchmark model (scripts/deepseek_bench_model.py: the real
# widths, random BF16 weights, a few layers) as a Hugging Face folder under models/, and its GGUF
# files written by `tokenmill quantize` (llama.cpp's deepseek2 layout, so both engines run the same
# file). Nothing is committed; a second run reuses what is there.
#
# Usage: scripts/deepseek-bench-model.sh [TYPE...]     (default: q4_k q4_0; prints one path a line:
#                                                       the folder, then each GGUF)
# Env:   LAYERS (default 4: the dense layer and 3 MoE layers), TOKENMILL_BIN (else built by
#        scripts/tokenmill-bin.sh)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
layers="${LAYERS:-4}"
types=("$@")
[ ${#types[@]} -eq 0 ] && types=(q4_k q4_0)
dir="$root/models/deepseek-v2-lite-shaped-l$layers"
py=python3
if ! python3 -c 'import numpy' 2>/dev/null; then
  venv="$HOME/.cache/tokenmill-bench-venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv" >&2
  "$venv/bin/python" -c 'import numpy' 2>/dev/null || "$venv/bin/pip" install -q numpy >&2
  py="$venv/bin/python"
fi
if [ ! -f "$dir/model.safetensors" ]; then
  echo "writing $dir (random weights, $layers layers) ..." >&2
  "$py" "$root/scripts/deepseek_bench_model.py" "$dir" --layers "$layers" >/dev/null
fi
echo "$dir"
bin="$("$root/scripts/tokenmill-bin.sh")"
for ty in "${types[@]}"; do
  out="$dir/model-$ty.gguf"
  if [ ! -f "$out" ]; then
    "$bin" quantize "$dir" "$out.partial" --type "$ty" >&2
    mv "$out.partial" "$out"
  fi
  echo "$out"
done
