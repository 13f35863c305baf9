#!/usr/bin/env python3
"""A random-weight Hugging Face folder with DeepSeek-V2-Lite's real widths, for benchmarks.

DeepSeek-V2-Lite (deepseek-ai/DeepSeek-V2-Lite, config.json): hidden 2048, 16 heads, no q_lora, kv_lora_rank 512,
qk_nope 128 / qk_rope 64 / v_head 128, YaRN (factor 40 over 4096), 64 routed experts with 6 active + 2 shared,
expert width 1408, the first layer dense (width 10944), vocabulary 102400, softmax routing without groups. Here
only the number of layers differs (default 4: the dense layer and 3 MoE layers), so one layer's work is the real
model's and a token's cost is that of a 4-layer slice of it plus the real embedding and LM head.

Weights are N(0, 0.02) (the config's initializer_range), norms 1, stored as BF16 like the real checkpoint, from a
fixed seed (the same folder on every machine). The tokenizer is the tiny byte-level one of the DeepSeek test
fixtures (256 tokens; ids past them are padding tokens in the GGUF), so text prompts tokenize to one token per
byte. Nothing here is committed: scripts/deepseek-bench-model.sh writes it under models/.

    python3 scripts/deepseek_bench_model.py OUT_DIR [--layers N]

Needs numpy only (the safetensors file is written by hand: an 8-byte header length, the JSON header, the data).
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "tests" / "fixtures" / "deepseek" / "v2"

HIDDEN, HEADS, VOCAB = 2048, 16, 102400
KV_LORA, NOPE, ROPE, V = 512, 128, 64, 128
EXPERTS, SHARED, MOE_WIDTH, DENSE_WIDTH = 64, 2, 1408, 10944


def config(layers: int) -> dict:
    return {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "attention_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": DENSE_WIDTH,
        "kv_lora_rank": KV_LORA,
        "max_position_embeddings": 163840,
        "moe_intermediate_size": MOE_WIDTH,
        "moe_layer_freq": 1,
        "n_group": 1,
        "n_routed_experts": EXPERTS,
        "n_shared_experts": SHARED,
        "norm_topk_prob": False,
        "num_attention_heads": HEADS,
        "num_experts_per_tok": 6,
        "num_hidden_layers": layers,
        "num_key_value_heads": HEADS,
        "q_lora_rank": None,
        "qk_nope_head_dim": NOPE,
        "qk_rope_head_dim": ROPE,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 4096,
            "type": "yarn",
        },
        "rope_theta": 10000,
        "routed_scaling_factor": 1.0,
        "scoring_func": "softmax",
        "tie_word_embeddings": False,
        "topk_group": 1,
        "topk_method": "greedy",
        "torch_dtype": "bfloat16",
        "v_head_dim": V,
        "vocab_size": VOCAB,
    }


def shapes(layers: int) -> list[tuple[str, tuple[int, ...]]]:
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for l in range(layers):
        p = f"model.layers.{l}"
        out += [
            (f"{p}.input_layernorm.weight", (HIDDEN,)),
            (f"{p}.self_attn.q_proj.weight", (HEADS * (NOPE + ROPE), HIDDEN)),
            (f"{p}.self_attn.kv_a_proj_with_mqa.weight", (KV_LORA + ROPE, HIDDEN)),
            (f"{p}.self_attn.kv_a_layernorm.weight", (KV_LORA,)),
            (f"{p}.self_attn.kv_b_proj.weight", (HEADS * (NOPE + V), KV_LORA)),
            (f"{p}.self_attn.o_proj.weight", (HIDDEN, HEADS * V)),
            (f"{p}.post_attention_layernorm.weight", (HIDDEN,)),
        ]
        mlp = lambda q, width: [  # noqa: E731
            (f"{q}.gate_proj.weight", (width, HIDDEN)),
            (f"{q}.up_proj.weight", (width, HIDDEN)),
            (f"{q}.down_proj.weight", (HIDDEN, width)),
        ]
        if l == 0:
            out += mlp(f"{p}.mlp", DENSE_WIDTH)
        else:
            out.append((f"{p}.mlp.gate.weight", (EXPERTS, HIDDEN)))
            for e in range(EXPERTS):
                out += mlp(f"{p}.mlp.experts.{e}", MOE_WIDTH)
            out += mlp(f"{p}.mlp.shared_experts", SHARED * MOE_WIDTH)
    out += [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]
    return out


def bf16(x: np.ndarray) -> bytes:
    """Round-to-nearest-even float32 -> bfloat16 bytes."""
    u = x.astype(np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16).tobytes()


def write_safetensors(path: Path, tensors: list[tuple[str, tuple[int, ...]]], seed: int) -> None:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        n = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape in tensors:
            if len(shape) == 1:
                f.write(bf16(np.ones(shape, np.float32)))
                continue
            # Row blocks keep the float32 scratch small for the 102400-row matrices.
            rows, cols = shape
            step = max(1, (1 << 24) // cols)
            for r in range(0, rows, step):
                n = min(step, rows - r)
                f.write(bf16(rng.standard_normal((n, cols), np.float32) * 0.02))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=20)
    args = ap.parse_args()
    if args.layers < 2:
        ap.error("--layers must be at least 2 (the dense layer and one MoE layer)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(json.dumps(config(args.layers), indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / f, args.out / f)
    tmp = args.out / "model.safetensors.partial"
    write_safetensors(tmp, shapes(args.layers), args.seed)
    tmp.rename(args.out / "model.safetensors")
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
