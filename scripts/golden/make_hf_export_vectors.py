#!/usr/bin/env python3
"""Reference for `tokenmill quantize HF_DIR OUT --type f32`: what llama.cpp's own converter writes.

Runs the peer llama.cpp's `convert_hf_to_gguf.py --outtype f32` (with its own gguf-py) on the
tiny Hugging Face fixtures tests/fixtures/hf/{llama,mistral,llama3-rope} and records, per
tensor, the GGML type, the dims (innermost first) and an FNV-1a 64-bit hash of the bytes,
plus the architecture metadata. crates/tokenmill/tests/quantize.rs checks that tokenmill's
export has the same tensors with the same bytes (so the Q/K permutation, the names, the
rope_freqs factors and the BF16/F16 -> F32 conversion are the converter's).

The tiny fixtures' byte-level tokenizer is unknown to the converter's pre-tokenizer hash
table, so `get_vocab_base_pre` is patched to "gpt-2" (only the tokenizer.ggml.pre string is
affected; the tokenizer metadata is not compared). qwen2 is left out: the converter's Qwen
vocab path asserts on this fixture's tokenizer.

Writes crates/tokenmill/tests/fixtures/hf_export/<name>.json. Run with the golden venv (needs
torch, transformers, numpy):
    /root/.cache/tokenmill-golden-venv/bin/python scripts/golden/make_hf_export_vectors.py
LLAMA_CPP_DIR overrides the llama.cpp source folder (default: the peer's).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "crates" / "tokenmill" / "tests" / "fixtures" / "hf_export"
LLAMA_CPP = Path(os.environ.get(
    "LLAMA_CPP_DIR",
    Path.home() / ".cache/tokenmill-peers/llama_cpp_python-0.3.36/vendor/llama.cpp"))
NAMES = ["llama", "mistral", "llama3-rope"]


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def convert(folder: Path, out: Path) -> None:
    sys.path[:0] = [str(LLAMA_CPP / "gguf-py"), str(LLAMA_CPP)]
    import conversion.base as base  # the converter's own package
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    argv, cwd = sys.argv, os.getcwd()
    sys.argv = ["convert_hf_to_gguf.py", str(folder), "--outtype", "f32", "--outfile", str(out)]
    os.chdir(LLAMA_CPP)
    try:
        runpy.run_path(str(LLAMA_CPP / "convert_hf_to_gguf.py"), run_name="__main__")
    finally:
        sys.argv = argv
        os.chdir(cwd)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in NAMES:
            path = Path(tmp) / f"{name}.gguf"
            convert(ROOT / "tests" / "fixtures" / "hf" / name, path)
            import gguf
            r = gguf.GGUFReader(path)
            arch = r.fields["general.architecture"].contents()
            meta = {k: f.contents() for k, f in r.fields.items() if k.startswith(arch + ".")}
            tensors = {
                t.name: {"type": t.tensor_type.name,
                         "dims": [int(d) for d in t.shape],
                         "fnv1a64": fnv1a64(bytes(t.data.tobytes()))}
                for t in r.tensors
            }
            doc = {"tool": "llama.cpp convert_hf_to_gguf.py --outtype f32",
                   "architecture": arch, "metadata": meta, "tensors": tensors}
            (OUT / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
            print(f"{name}: {len(tensors)} tensors -> {(OUT / f'{name}.json').relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
