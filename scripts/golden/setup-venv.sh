#!/usr/bin/env bash
# (Re)creates the Python venv used to regenerate the golden fixtures (tests/fixtures/smollm2, tests/fixtures/tiny)
# from PyPI, with the exact versions in scripts/golden/requirements.txt (pip freeze of the venv that produced the
# committed fixtures: Python 3.11, torch 2.15.0, transformers 5.24.0, gguf 0.19.0, ...).
#
# CI never runs this: torch is several GB. CI only reads the committed fixtures.
#
# Usage: scripts/golden/setup-venv.sh [--recreate]     -> prints the venv's python
#   --recreate           delete the venv first
#   TOKENMILL_GOLDEN_VENV  venv path (default: ~/.cache/tokenmill-golden-venv)
#   PYTHON               interpreter to create it with (default: python3; 3.11 was used for the fixtures)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${TOKENMILL_GOLDEN_VENV:-$HOME/.cache/tokenmill-golden-venv}"
python="${PYTHON:-python3}"

if [ "${1:-}" = "--recreate" ]; then
  rm -rf "$venv"
elif [ -n "${1:-}" ]; then
  echo "usage: $0 [--recreate]" >&2
  exit 2
fi

pyver="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$pyver" != "3.11" ]; then
  echo "warning: fixtures were made with Python 3.11; $python is $pyver (numpy 2.4 needs >= 3.11)" >&2
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "creating venv at $venv ..." >&2
  "$python" -m venv "$venv"
fi
echo "installing pinned packages (torch is large: several GB with its CUDA libraries) ..." >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt" >&2
"$venv/bin/python" - <<'PY' >&2
import gguf, numpy, tokenizers, torch, transformers  # noqa: F401
print(f"ok: torch {torch.__version__}, transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")
PY
echo "$venv/bin/python"
