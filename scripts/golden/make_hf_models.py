#!/usr/bin/env python3
"""Tiny random-weight Hugging Face model folders (config.json + safetensors + tokenizer) with reference logits.

For each model: build the HF model from a config with seeded random weights (the same init as make_tiny_models.py),
round the weights to the storage dtype (so the reference sees exactly the stored values), compute fp32 reference
logits for a fixed token sequence and 8 greedy tokens, then `save_pretrained` the folder in that dtype. Writes
tests/fixtures/hf/<name>/{config.json, model.safetensors | model-0000N-of-0000M.safetensors +
model.safetensors.index.json, tokenizer.json, tokenizer_config.json, reference.json}. CI never runs this script
(no torch there); it only reads the committed folders.

    ~/.cache/tokenmill-golden-venv/bin/python scripts/golden/make_hf_models.py

Coverage: llama (F32, one file), qwen2 (F32, sharded with an index; QKV bias, tied embeddings), mistral (BF16),
llama3-rope (F16, Llama 3.1 RoPE scaling, tied embeddings).

Tokenizer: a byte-level BPE with 256 tokens (token i = GPT-2 bytes_to_unicode of byte i, so ids are UTF-8 bytes), no
merges; tokenizer_config.json names bos (id 1) / eos (id 2), add_bos_token false, and carries a small chat template.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import shutil
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_models import (  # noqa: E402
    BOS,
    EOS,
    GREEDY_NEW,
    INIT_NOTE,
    INPUT_IDS,
    MODELS as GGUF_MODELS,
    byte_tokens,
    hf_greedy,
    hf_logits,
    init_weights,
    round_sig,
)

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "tests" / "fixtures" / "hf"
PROMPT_TEXT = "Tiny \U0001f999 GGUF!"
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

# name -> (the make_tiny_models.py spec it shares config and seed with, storage dtype, max shard size or None)
MODELS = {
    "llama": ("llama", torch.float32, None),
    "qwen2": ("qwen2", torch.float32, "150KB"),
    "mistral": ("mistral", torch.bfloat16, None),
    "llama3-rope": ("llama3-rope", torch.float16, None),
}


def write_tokenizer(out: Path) -> None:
    vocab = {piece: i for i, piece in enumerate(byte_tokens())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(out / "tokenizer.json"))
    pieces = byte_tokens()
    cfg = {
        "bos_token": pieces[BOS],
        "eos_token": pieces[EOS],
        "add_bos_token": False,
        "add_eos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    ids = Tokenizer.from_file(str(out / "tokenizer.json")).encode(PROMPT_TEXT).ids
    assert ids == INPUT_IDS[1:], (ids, INPUT_IDS)


def make_one(name: str, base: str, dtype: torch.dtype, shard: str | None) -> None:
    spec = GGUF_MODELS[base]
    torch.manual_seed(spec["seed"])
    cfg = spec["config"]()
    cfg._attn_implementation = "eager"
    model = spec["cls"](cfg).to(torch.float32)
    init_weights(model, spec["seed"])
    # The stored values are the dtype-rounded weights; the reference runs them in fp32. Only the
    # parameters are rounded: `model.to(dtype)` would also round buffers such as RoPE's inv_freq.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).to(torch.float32))
    model.eval()
    ref = hf_logits(model, INPUT_IDS)
    greedy, margin = hf_greedy(model, INPUT_IDS, GREEDY_NEW)

    out = OUT_DIR / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    kw = {"max_shard_size": shard} if shard else {}
    model.to(dtype).save_pretrained(out, safe_serialization=True, **kw)  # after the reference
    (out / "generation_config.json").unlink(missing_ok=True)
    write_tokenizer(out)

    files = sorted(p.name for p in out.iterdir())
    doc = {
        "name": name,
        "hf_class": spec["cls"].__name__,
        "storage_dtype": str(dtype).removeprefix("torch."),
        "files": {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in files},
        "seed": spec["seed"],
        "init": INIT_NOTE + "; then rounded to storage_dtype",
        "versions": {
            "python": platform.python_version(),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
        },
        "prompt_text": PROMPT_TEXT,
        "input_ids": INPUT_IDS,
        "greedy_ids": greedy,
        "greedy_min_logit_margin": margin,
        "greedy_note": f"{GREEDY_NEW} argmax tokens after input_ids, full fp32 forward each step, no EOS stopping",
        "logits_note": "logits[i][v]: fp32 HF logits at position i for token v, rounded to 6 significant digits",
        "logits": round_sig(ref),
    }
    text = json.dumps(doc, separators=(",", ":"))
    text = text.replace('"logits":[[', '"logits":[\n[').replace("],[", "],\n[")
    (out / "reference.json").write_text(text + "\n", encoding="ascii")
    size = sum((out / f).stat().st_size for f in files)
    print(f"{name}: {files} {size} B, greedy {greedy} (min margin {margin:.3g})")


def main() -> None:
    torch.set_num_threads(2)
    names = sys.argv[1:] or list(MODELS)
    for n in names:
        make_one(n, *MODELS[n])


if __name__ == "__main__":
    main()
