#!/usr/bin/env python3
"""Tiny AWQ / GPTQ int4 Hugging Face folders with the logits of their dequantized weights (issue 8).

One seeded random Llama (make_tiny_models.py's "llama" shape: hidden 64, ffn 128, 4 heads / 2 KV heads,
2 layers, vocab 256) is quantized to 4 bits with group size 32 and packed by hand, exactly as the
checkpoints store it (no autoawq / gptq packages needed; the packers are make_int4_fixtures.py's):

  awq             AutoAWQ GEMM: qweight int32 [in, out/8] (nibble order 0,2,4,6,1,3,5,7),
                  qzeros int32 [in/g, out/8] (same order), scales f16 [in/g, out]; asymmetric zeros
  gptq            AutoGPTQ "gptq" checkpoint_format: qweight int32 [in/8, out], qzeros int32
                  [in/g, out/8] storing zero - 1, scales f16 [in/g, out], g_idx int32 [in] = k / g;
                  asymmetric (sym false)
  gptq-act-order  the same format with desc_act true, sym true (zero 8, stored 7) and g_idx a
                  permutation-based grouping (each layer: a random permutation of the inputs, cut into
                  groups of 32); lm_head quantized too (GPTQModel's `lm_head: true`)

Embedding and norms stay float (F16, as AWQ/GPTQ checkpoints keep them), and so does lm_head except in
gptq-act-order; every parameter is
first rounded to f16 so the reference sees exactly the stored values. The reference model is the HF
fp32 LlamaForCausalLM whose linear weights are overwritten with the *dequantized* int4 weights,
W = (q - z[g_idx]) * s[g_idx], computed from the packed tensors by make_int4_fixtures.py's independent
unpacker. Writes tests/fixtures/int4-models/<name>/{config.json (with quantization_config),
model.safetensors, tokenizer.json, tokenizer_config.json (copied from tests/fixtures/hf/llama),
reference.json (logits at every position of input_ids, greedy continuation)}. CI never runs this script.

    ~/.cache/tokenmill-golden-venv/bin/python scripts/golden/make_int4_models.py
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_int4_fixtures import (  # noqa: E402
    pack_awq_cols,
    pack_gptq_rows,
    pack_seq_cols,
    quantize,
    unpack_reference,
)
from make_tiny_models import (  # noqa: E402
    GREEDY_NEW,
    INIT_NOTE,
    INPUT_IDS,
    MODELS as TINY_MODELS,
    hf_greedy,
    hf_logits,
    init_weights,
    round_sig,
)

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "tests" / "fixtures" / "int4-models"
TOKENIZER_FROM = ROOT / "tests" / "fixtures" / "hf" / "llama"
GROUP = 32
SEED = 8008
LINEARS = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
]

# name -> (format, act_order, sym, quantization_config)
VARIANTS = {
    "awq": (
        "awq",
        False,
        False,
        {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"},
    ),
    "gptq": (
        "gptq",
        False,
        False,
        {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": GROUP,
            "desc_act": False,
            "sym": False,
            "checkpoint_format": "gptq",
        },
    ),
    "gptq-act-order": (
        "gptq",
        True,
        True,
        {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": GROUP,
            "desc_act": True,
            "sym": True,
            "checkpoint_format": "gptq",
            "lm_head": True,
        },
    ),
}


def quantize_sym(w: np.ndarray, g_idx: np.ndarray, n_groups: int):
    """GPTQ sym=True: zero 8, scale 2 * max|w| / 15 per (group, column) (AutoGPTQ's Quantizer)."""
    K, N = w.shape
    q = np.zeros((K, N), dtype=np.uint8)
    z = np.full((n_groups, N), 8, dtype=np.uint8)
    s = np.zeros((n_groups, N), dtype=np.float16)
    for g in range(n_groups):
        rows = np.nonzero(g_idx == g)[0]
        wg = w[rows]
        scale = (2 * np.abs(wg).max(0) / 15).astype(np.float16)
        sf = scale.astype(np.float32)
        sf[sf == 0] = 1.0
        q[rows] = np.clip(np.round(wg / sf) + 8, 0, 15).astype(np.uint8)
        s[g] = scale
    return q, z, s


def pack_layer(w_out_in: np.ndarray, fmt: str, act_order: bool, sym: bool, rng) -> tuple[dict, np.ndarray]:
    """One linear (torch layout [out, in]) -> (checkpoint tensors by suffix, dequantized [out, in])."""
    w = np.ascontiguousarray(w_out_in.T)  # [K = in, N = out]
    K, _ = w.shape
    n_groups = K // GROUP
    if act_order:
        perm = rng.permutation(K)
        g_idx = np.empty(K, dtype=np.int32)
        g_idx[perm] = np.arange(K) // GROUP
    else:
        g_idx = (np.arange(K) // GROUP).astype(np.int32)
    q, z, s = quantize_sym(w, g_idx, n_groups) if sym else quantize(w, g_idx, n_groups, zero_floor=1)
    if fmt == "awq":
        t = {"qweight": pack_awq_cols(q), "qzeros": pack_awq_cols(z), "scales": s}
        deq = unpack_reference(0, 0, t["qweight"], t["qzeros"], s, None, K, w.shape[1], GROUP)
    else:
        stored = ((z.astype(np.int32) - 1) & 0xF).astype(np.uint8)  # classic: zero - 1
        t = {"qweight": pack_gptq_rows(q), "qzeros": pack_seq_cols(stored), "scales": s, "g_idx": g_idx}
        deq = unpack_reference(1, 0, t["qweight"], t["qzeros"], s, g_idx, K, w.shape[1], GROUP)
    return t, deq.T


def base_model():
    spec = TINY_MODELS["llama"]
    torch.manual_seed(spec["seed"])
    cfg = spec["config"]()
    cfg._attn_implementation = "eager"
    model = spec["cls"](cfg).to(torch.float32)
    init_weights(model, spec["seed"])
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.float16).to(torch.float32))
    return model.eval(), spec


def make_one(name: str, fmt: str, act_order: bool, sym: bool, qcfg: dict) -> None:
    model, spec = base_model()
    rng = np.random.default_rng([SEED, list(VARIANTS).index(name)])
    tensors: dict[str, np.ndarray] = {}
    quantized = set()
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            for lin in LINEARS:
                mod = layer.get_submodule(lin)
                base = f"model.layers.{i}.{lin}"
                t, deq = pack_layer(mod.weight.numpy(), fmt, act_order, sym, rng)
                for suffix, a in t.items():
                    tensors[f"{base}.{suffix}"] = np.ascontiguousarray(a)
                mod.weight.copy_(torch.from_numpy(np.ascontiguousarray(deq)))
                quantized.add(f"{base}.weight")
        if qcfg.get("lm_head"):
            t, deq = pack_layer(model.lm_head.weight.numpy(), fmt, act_order, sym, rng)
            for suffix, a in t.items():
                tensors[f"lm_head.{suffix}"] = np.ascontiguousarray(a)
            model.lm_head.weight.copy_(torch.from_numpy(np.ascontiguousarray(deq)))
            quantized.add("lm_head.weight")
        for pname, p in model.named_parameters():
            if pname not in quantized:
                tensors[pname] = p.numpy().astype(np.float16)
    ref = hf_logits(model, INPUT_IDS)
    greedy, margin = hf_greedy(model, INPUT_IDS, GREEDY_NEW)

    out = OUT_DIR / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((TOKENIZER_FROM / "config.json").read_text())
    config["dtype"] = "float16"
    config["quantization_config"] = qcfg
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(TOKENIZER_FROM / f, out / f)

    files = sorted(p.name for p in out.iterdir())
    doc = {
        "name": name,
        "hf_class": spec["cls"].__name__,
        "quantization_config": qcfg,
        "files": {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in files},
        "seed": spec["seed"],
        "init": INIT_NOTE + "; rounded to f16; linears quantized to int4 (group 32) and replaced by "
        "their dequantized weights for the reference",
        "versions": {
            "python": platform.python_version(),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
        },
        "input_ids": INPUT_IDS,
        "greedy_ids": greedy,
        "greedy_min_logit_margin": margin,
        "greedy_note": f"{GREEDY_NEW} argmax tokens after input_ids, full fp32 forward each step, no EOS stopping",
        "logits_note": "logits[i][v]: fp32 HF logits (dequantized weights) at position i for token v, "
        "rounded to 6 significant digits",
        "logits": round_sig(ref),
    }
    text = json.dumps(doc, separators=(",", ":"))
    text = text.replace('"logits":[[', '"logits":[\n[').replace("],[", "],\n[")
    (out / "reference.json").write_text(text + "\n", encoding="ascii")
    size = sum((out / f).stat().st_size for f in files)
    print(f"{name}: {files} {size} B, greedy {greedy} (min margin {margin:.3g})")


def main() -> None:
    torch.set_num_threads(2)
    for name in sys.argv[1:] or list(VARIANTS):
        make_one(name, *VARIANTS[name])


if __name__ == "__main__":
    main()
