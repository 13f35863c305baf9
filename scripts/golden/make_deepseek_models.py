#!/usr/bin/env python3
"""Tiny random-weight DeepSeek V2 / V3 Hugging Face folders with reference logits.

Each model: 3 layers (layer 0 dense, layers 1-2 MoE with 4 routed + 1 shared expert, top-2), q LoRA, MLA with
kv_lora_rank 16, qk_nope 8 / qk_rope 4 / v 12 head dims, DeepSeek YaRN RoPE (factor 4, mscale = mscale_all_dim =
0.707), fp32 throughout. Written with save_pretrained (per-expert tensor names) to tests/fixtures/deepseek/<name>/
plus reference.json (fp32 logits for a fixed sequence, 8 greedy tokens, and the smallest top-k routing gap seen,
so a near-tie that could flip an expert choice is visible). CI never runs this; it only reads the files.

    ~/.cache/tokenmill-golden-venv/bin/python scripts/golden/make_deepseek_models.py

v2: DeepseekV2ForCausalLM, softmax routing, topk_method greedy, routed_scaling_factor 1.5.
v3: DeepseekV3ForCausalLM, sigmoid routing + e_score_correction_bias, n_group 2 / topk_group 1, norm_topk_prob,
    routed_scaling_factor 2.5.
"""

from __future__ import annotations

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
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_hf_models import write_tokenizer  # noqa: E402
from make_tiny_models import GREEDY_NEW, INPUT_IDS, hf_greedy, hf_logits, round_sig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "tests" / "fixtures" / "deepseek"

COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=4,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    q_lora_rank=24,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=12,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
    },
)

MODELS = {
    "v2": dict(
        seed=2001,
        cls=DeepseekV2ForCausalLM,
        config=lambda: DeepseekV2Config(
            **COMMON, routed_scaling_factor=1.5, topk_method="greedy", architectures=["DeepseekV2ForCausalLM"]
        ),
    ),
    "v3": dict(
        seed=2002,
        cls=DeepseekV3ForCausalLM,
        config=lambda: DeepseekV3Config(
            **COMMON,
            routed_scaling_factor=2.5,
            n_group=2,
            topk_group=1,
            norm_topk_prob=True,
            rope_interleave=True,
            architectures=["DeepseekV3ForCausalLM"],
        ),
    ),
}

INIT = (
    "seeded torch.Generator over named_parameters in order: *norm.weight ~ 1 + 0.2 N; embed ~ 0.1 N; "
    "e_score_correction_bias ~ 0.1 N; q/kv projections ~ 2 N / sqrt(fan_in); router (mlp.gate) ~ 3 N / sqrt(fan_in); "
    "other matrices ~ N / sqrt(fan_in) (fan_in = last dim)"
)


def init_weights(model, seed: int) -> None:  # noqa: ANN001
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif "embed_tokens" in name:
                p.copy_(0.1 * noise)
            elif name.endswith("e_score_correction_bias"):
                p.copy_(0.1 * noise)
            else:
                gain = 1.0
                if any(k in name for k in ("q_a_proj", "q_b_proj", "q_proj", "kv_a_proj", "kv_b_proj")):
                    gain = 2.0
                elif name.endswith("mlp.gate.weight"):
                    gain = 3.0
                p.copy_(gain * noise / math.sqrt(p.shape[-1]))
    for buf_name, b in model.named_buffers():
        if buf_name.endswith("e_score_correction_bias"):
            with torch.no_grad():
                b.copy_(0.1 * torch.randn(b.shape, generator=g))


def routing_margins(model) -> list[float]:  # noqa: ANN001
    """Smallest gap between the k-th and (k+1)-th choice score over every token and MoE layer."""
    gaps: list[float] = []

    def hook(mod, inp, out):  # noqa: ANN001
        x = inp[0].reshape(-1, mod.weight.shape[1]).float()
        logits = x @ mod.weight.float().T
        if hasattr(mod, "e_score_correction_bias"):
            s = logits.sigmoid() + mod.e_score_correction_bias
        else:
            s = logits.softmax(-1)
        top = torch.sort(s, dim=-1, descending=True).values
        k = mod.top_k
        gaps.append(float((top[:, k - 1] - top[:, k]).min()))

    hs = [m.register_forward_hook(hook) for n, m in model.named_modules() if n.endswith("mlp.gate")]
    hf_logits(model, INPUT_IDS)
    for h in hs:
        h.remove()
    return gaps


def make_one(name: str, spec: dict) -> None:
    torch.manual_seed(spec["seed"])
    cfg = spec["config"]()
    cfg._attn_implementation = "eager"
    model = spec["cls"](cfg).to(torch.float32)
    init_weights(model, spec["seed"])
    model.eval()
    ref = hf_logits(model, INPUT_IDS)
    greedy, margin = hf_greedy(model, INPUT_IDS, GREEDY_NEW)
    gaps = routing_margins(model)
    out = OUT_DIR / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)
    write_tokenizer(out)
    doc = {
        "name": name,
        "hf_class": spec["cls"].__name__,
        "seed": spec["seed"],
        "init": INIT,
        "versions": {"python": platform.python_version(), "transformers": transformers.__version__,
                     "torch": torch.__version__, "numpy": np.__version__},
        "input_ids": INPUT_IDS,
        "greedy_ids": greedy,
        "greedy_min_logit_margin": margin,
        "routing_min_topk_gap_per_moe_layer": gaps,
        "logits": round_sig(ref),
    }
    text = json.dumps(doc, separators=(",", ":"))
    text = text.replace('"logits":[[', '"logits":[\n[').replace("],[", "],\n[")
    (out / "reference.json").write_text(text + "\n", encoding="ascii")
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"{name}: {size} B, greedy {greedy} (margin {margin:.3g}), routing gaps {gaps}")


def main() -> None:
    torch.set_num_threads(2)
    for n in sys.argv[1:] or list(MODELS):
        make_one(n, MODELS[n])


if __name__ == "__main__":
    main()
