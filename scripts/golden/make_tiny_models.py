#!/usr/bin/env python3
"""Tiny random-weight reference models for architectures the default model does not cover.

For each model: build the HF model from a config with seeded random weights, compute reference logits in fp32 for
a fixed token sequence, and write the SAME weights as an F32 GGUF the way llama.cpp's convert_hf_to_gguf.py would.
Writes tests/fixtures/tiny/<name>.gguf and <name>.json. CI never runs this script; it only reads the committed files.

    ~/.cache/tokenmill-golden-venv/bin/python scripts/golden/make_tiny_models.py

GGUF conventions followed (convert_hf_to_gguf.py: TextModel.set_gguf_parameters, LlamaModel, Qwen2Model):
  * tensor names from gguf.TensorNameMap (token_embd, blk.N.attn_{norm,q,k,v,output}, blk.N.ffn_{norm,gate,up,down},
    output_norm, output; qwen2 adds blk.N.attn_{q,k,v}.bias); `output.weight` omitted when embeddings are tied;
    every tensor F32 (general.file_type = ALL_F32), HF [out, in] row-major, i.e. GGUF ne = [in, out].
  * arch `llama` (LlamaForCausalLM, MistralForCausalLM): Q and K weights permuted with LlamaModel.permute (so
    llama.cpp's "normal" interleaved-pair RoPE is right); metadata adds vocab_size and rope.dimension_count.
  * arch `qwen2`: weights unpermuted (llama.cpp uses NeoX RoPE for qwen2); no vocab_size / rope.dimension_count
    (Qwen2Model writes neither; a loader must default the rotary width to the head size).
  * llama3 RoPE: no rope.scaling.* keys; a `rope_freqs.weight` F32 tensor [head_dim/2] of per-pair frequency divisors
    (LlamaModel.generate_extra_tensors). convert reads `original_max_position_embeddings` from the config's top level,
    so the HF config sets it there too (= rope_parameters' value) to keep HF and the GGUF identical.
  * tokenizer: tokenizer.ggml.model "gpt2", pre "gpt-2", 256 byte-level tokens (token i = GPT-2 bytes_to_unicode of
    byte i, so ids are UTF-8 bytes), all NORMAL, an EMPTY merges array (written explicitly: GGUFWriter drops empty
    arrays, but llama.cpp requires the key), bos 1, eos 2, add_bos_token false.

Checks recorded in each JSON:
  * gguf_roundtrip_max_abs_diff: transformers loads the GGUF back (from_pretrained(dir, gguf_file=...)), max |logit
    diff| vs the original HF model. transformers' GGUF loader ignores rope_freqs, so for llama3-rope the HF config is
    passed in (a weights-only round trip); the GGUF-config-only diff is recorded separately.
  * llamacpp_semantics_max_abs_diff: an independent float64 numpy forward pass that reads only the GGUF and applies
    llama.cpp's semantics (NORM interleaved RoPE for llama, NEOX for qwen2, rope_freqs divisors, GQA head mapping,
    tied output fallback) vs the HF logits; plus how far off a wrong RoPE pairing / ignoring rope_freqs would be.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from gguf import GGUFReader, GGUFValueType  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "tests" / "fixtures" / "tiny"
VOCAB = 256
BOS, EOS = 1, 2
# BOS + the UTF-8 bytes of "Tiny 🦙 GGUF!" (ids are bytes with the byte-level vocabulary): 16 tokens
INPUT_IDS = [BOS] + list("Tiny \U0001f999 GGUF!".encode("utf-8"))
GREEDY_NEW = 8

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=BOS,
    eos_token_id=EOS,
    hidden_act="silu",
)

MODELS = {
    "llama": dict(
        seed=1001,
        cls=LlamaForCausalLM,
        gguf_arch="llama",
        config=lambda: LlamaConfig(
            **COMMON,
            num_hidden_layers=2,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=False,
            architectures=["LlamaForCausalLM"],
        ),
    ),
    "llama3-rope": dict(
        seed=1002,
        cls=LlamaForCausalLM,
        gguf_arch="llama",
        config=lambda: LlamaConfig(
            **COMMON,
            num_hidden_layers=2,
            rms_norm_eps=1e-5,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            # convert_hf_to_gguf reads this key from the top level (default 8192); keep it equal to the rope value
            original_max_position_embeddings=64,
            tie_word_embeddings=True,
            architectures=["LlamaForCausalLM"],
        ),
    ),
    "qwen2": dict(
        seed=1033,  # 1003 gave a greedy near-tie (top1-top2 logit gap 9e-4)
        cls=Qwen2ForCausalLM,
        gguf_arch="qwen2",
        config=lambda: Qwen2Config(
            **COMMON,
            num_hidden_layers=2,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=True,
            use_sliding_window=False,
            architectures=["Qwen2ForCausalLM"],
        ),
    ),
    "mistral": dict(
        seed=1004,
        cls=MistralForCausalLM,
        gguf_arch="llama",  # convert_hf_to_gguf maps MistralForCausalLM to LlamaModel
        config=lambda: MistralConfig(
            **COMMON,
            num_hidden_layers=2,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            sliding_window=None,
            tie_word_embeddings=False,
            architectures=["MistralForCausalLM"],
        ),
    ),
}

INIT_NOTE = (
    "seeded torch.Generator over model.named_parameters() in order: *norm.weight ~ 1 + 0.2*N(0,1); *.bias ~ "
    "0.5*N(0,1); embed_tokens ~ 0.1*N(0,1) (small, so tied models do not just echo the last token); q_proj/k_proj ~ 2*N(0,1)/sqrt(fan_in) (sharp attention, so RoPE "
    "errors show); other matrices ~ N(0,1)/sqrt(fan_in)"
)


# --------------------------------------------------------------------------------------------------------------
# Model construction


def init_weights(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.5 * noise)
            elif "embed_tokens" in name:
                p.copy_(0.1 * noise)
            else:
                gain = 2.0 if ("q_proj" in name or "k_proj" in name) else 1.0
                p.copy_(gain * noise / math.sqrt(p.shape[1]))


@torch.no_grad()
def hf_logits(model, ids: list[int]) -> np.ndarray:
    return model(torch.tensor([ids], dtype=torch.long)).logits[0].float().numpy()


@torch.no_grad()
def hf_greedy(model, ids: list[int], n: int) -> tuple[list[int], float]:
    """n argmax tokens (no EOS stopping) and the smallest top1-top2 logit gap along the way."""
    ids = list(ids)
    out, margin = [], float("inf")
    for _ in range(n):
        last = hf_logits(model, ids)[-1]
        top2 = np.sort(last)[-2:]
        margin = min(margin, float(top2[1] - top2[0]))
        nxt = int(np.argmax(last))
        out.append(nxt)
        ids.append(nxt)
    return out, margin


# --------------------------------------------------------------------------------------------------------------
# GGUF writing (convert_hf_to_gguf.py conventions)


class Writer(gguf.GGUFWriter):
    """GGUFWriter that can also write an empty typed array (the stock writer refuses / silently drops them)."""

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):  # noqa: ANN001
        if vtype == GGUFValueType.ARRAY and sub_type is not None and len(val) == 0:
            out = bytearray()
            if add_vtype:
                out += self._pack("I", vtype)
            out += self._pack("I", sub_type)
            out += self._pack("Q", 0)
            return bytes(out)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def llama_permute(w: torch.Tensor, n_head: int, n_head_kv: int | None) -> torch.Tensor:
    # convert_hf_to_gguf.py LlamaModel.permute
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(hp: dict) -> list[float]:
    # convert_hf_to_gguf.py LlamaModel.generate_extra_tensors
    rp = hp["rope_parameters"]
    base = rp.get("rope_theta", 10000.0)
    dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = rp.get("factor", 8.0)
    low_freq_factor = rp.get("low_freq_factor", 1.0)
    high_freq_factor = rp.get("high_freq_factor", 4.0)
    old_context_len = hp.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            factors.append(1)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return [float(f) for f in factors]


def byte_tokens() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    b2u = bytes_to_unicode()
    return [b2u[b] for b in range(256)]


def write_gguf(path: Path, name: str, arch: str, model, hp: dict) -> dict:
    n_head, n_kv = hp["num_attention_heads"], hp["num_key_value_heads"]
    head_dim = hp.get("head_dim") or hp["hidden_size"] // n_head
    w = Writer(str(path), arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"tokenmill tiny {name}")
    # TextModel.set_gguf_parameters
    w.add_block_count(hp["num_hidden_layers"])
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    rp = hp["rope_parameters"]
    rope_type = rp.get("rope_type")
    if rope_type == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rp["factor"])
    elif rope_type not in (None, "default", "llama3"):
        raise NotImplementedError(rope_type)
    w.add_rope_freq_base(rp["rope_theta"])
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    if hp.get("head_dim") is not None:
        w.add_key_length(hp["head_dim"])
        w.add_value_length(hp["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if arch == "llama":  # LlamaModel.set_gguf_parameters
        w.add_vocab_size(hp["vocab_size"])
        w.add_rope_dimension_count(head_dim)
    # tokenizer (minimal byte-level vocabulary)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(byte_tokens())
    w.add_token_types([gguf.TokenType.NORMAL] * VOCAB)
    w.add_key_value(gguf.Keys.Tokenizer.MERGES, [], GGUFValueType.ARRAY, sub_type=GGUFValueType.STRING)
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)
    w.add_add_bos_token(False)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    tensors: list[tuple[str, np.ndarray]] = []
    if arch == "llama" and rope_type == "llama3":
        tensors.append(("rope_freqs.weight", np.array(llama3_rope_factors(hp), dtype=np.float32)))
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], hp["num_hidden_layers"])
    sd = model.state_dict()
    for hf_name, t in sd.items():
        if hf_name == "lm_head.weight" and hp["tie_word_embeddings"]:
            continue  # tied: the safetensors checkpoint convert reads has no lm_head; llama.cpp reuses token_embd
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue
        t = t.detach().to(torch.float32).clone()
        if arch == "llama":
            if hf_name.endswith(("q_proj.weight", "q_proj.bias")):
                t = llama_permute(t, n_head, n_head)
            elif hf_name.endswith(("k_proj.weight", "k_proj.bias")):
                t = llama_permute(t, n_head, n_kv)
        new_name = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise ValueError(f"cannot map tensor {hf_name!r}")
        tensors.append((new_name, t.numpy()))
    for tname, arr in tensors:
        w.add_tensor(tname, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {tn: list(reversed(a.shape)) for tn, a in tensors}  # GGUF ne order (ne[0] = row length)


# --------------------------------------------------------------------------------------------------------------
# Independent llama.cpp-semantics reference, reading only the GGUF


def _field(r: GGUFReader, key: str, default=None):  # noqa: ANN001
    f = r.fields.get(key)
    return default if f is None else f.contents()


def llamacpp_forward(
    path: Path, ids: list[int], rope_mode: str | None = None, use_freq_factors: bool = True
) -> np.ndarray:
    r = GGUFReader(str(path))
    arch = _field(r, "general.architecture")
    k = lambda s, d=None: _field(r, f"{arch}.{s}", d)  # noqa: E731
    T = {t.name: np.array(t.data, dtype=np.float64).reshape([int(x) for x in reversed(t.shape)]) for t in r.tensors}
    n_layer, n_embd = k("block_count"), k("embedding_length")
    n_head, n_kv = k("attention.head_count"), k("attention.head_count_kv")
    head_dim = k("attention.key_length", n_embd // n_head)
    n_rot = k("rope.dimension_count", head_dim)
    eps, base = k("attention.layer_norm_rms_epsilon"), k("rope.freq_base", 10000.0)
    if rope_mode is None:
        rope_mode = {"llama": "norm", "qwen2": "neox"}[arch]
    ff = T.get("rope_freqs.weight") if use_freq_factors else None
    n = len(ids)

    def rms(x, wt):  # noqa: ANN001
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * wt

    pos = np.arange(n, dtype=np.float64)
    inv = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    if ff is not None:
        inv = inv / ff
    ang = pos[:, None] * inv[None, :]  # [n, n_rot/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):  # noqa: ANN001  x: [n, heads, head_dim]
        x = x.copy()
        if rope_mode == "norm":
            a, b = x[..., 0:n_rot:2].copy(), x[..., 1:n_rot:2].copy()
            x[..., 0:n_rot:2], x[..., 1:n_rot:2] = a * cos - b * sin, a * sin + b * cos
        else:
            h = n_rot // 2
            a, b = x[..., :h].copy(), x[..., h:n_rot].copy()
            x[..., :h], x[..., h:n_rot] = a * cos - b * sin, a * sin + b * cos
        return x

    x = T["token_embd.weight"][ids]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(n_layer):
        p = f"blk.{i}."
        h = rms(x, T[p + "attn_norm.weight"])

        def lin(name, h=h, p=p):  # noqa: ANN001
            y = h @ T[p + name + ".weight"].T
            return y + T[p + name + ".bias"] if (p + name + ".bias") in T else y

        q = rope(lin("attn_q").reshape(n, n_head, head_dim))
        kk = rope(lin("attn_k").reshape(n, n_kv, head_dim))
        v = lin("attn_v").reshape(n, n_kv, head_dim)
        att_out = np.zeros((n, n_head, head_dim))
        for hh in range(n_head):
            kv = hh // (n_head // n_kv)  # ggml broadcast: q head h uses kv head h / (n_head/n_kv)
            s = q[:, hh] @ kk[:, kv].T / math.sqrt(head_dim) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            att_out[:, hh] = s @ v[:, kv]
        x = x + att_out.reshape(n, n_head * head_dim) @ T[p + "attn_output.weight"].T
        h = rms(x, T[p + "ffn_norm.weight"])
        gate = h @ T[p + "ffn_gate.weight"].T
        up = h @ T[p + "ffn_up.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * up) @ T[p + "ffn_down.weight"].T
    x = rms(x, T["output_norm.weight"])
    out_w = T.get("output.weight", T["token_embd.weight"])
    return x @ out_w.T


# --------------------------------------------------------------------------------------------------------------


def round_sig(a: np.ndarray, sig: int = 6) -> list:
    return [[float(f"{v:.{sig}g}") for v in row] for row in a.tolist()]


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def roundtrip_via_transformers(path: Path, ref: np.ndarray, config=None) -> float:  # noqa: ANN001
    with tempfile.TemporaryDirectory() as td:
        shutil.copy(path, Path(td) / path.name)
        kw = {"config": config} if config is not None else {}
        m = AutoModelForCausalLM.from_pretrained(td, gguf_file=path.name, dtype=torch.float32, **kw)
        m.eval()
        return float(np.max(np.abs(hf_logits(m, INPUT_IDS) - ref)))


def make_one(name: str, spec: dict) -> None:
    torch.manual_seed(spec["seed"])
    cfg = spec["config"]()
    cfg._attn_implementation = "eager"
    model = spec["cls"](cfg).to(torch.float32)
    init_weights(model, spec["seed"])
    model.eval()
    hp = cfg.to_dict()
    ref = hf_logits(model, INPUT_IDS)
    greedy, greedy_margin = hf_greedy(model, INPUT_IDS, GREEDY_NEW)

    gguf_path = OUT_DIR / f"{name}.gguf"
    shapes = write_gguf(gguf_path, name, spec["gguf_arch"], model, hp)

    checks: dict = {}
    llama3 = hp["rope_parameters"].get("rope_type") == "llama3"
    try:
        if llama3:
            checks["gguf_roundtrip_max_abs_diff"] = roundtrip_via_transformers(gguf_path, ref, config=cfg)
            checks["gguf_roundtrip_gguf_config_max_abs_diff"] = roundtrip_via_transformers(gguf_path, ref)
            checks["gguf_roundtrip_note"] = (
                "transformers' GGUF loader ignores rope_freqs.weight (its llama config has no llama3 rope), so "
                "gguf_roundtrip_max_abs_diff loads the GGUF weights with the original HF config; "
                "gguf_roundtrip_gguf_config_max_abs_diff uses the config transformers derives from the GGUF alone"
            )
        else:
            checks["gguf_roundtrip_max_abs_diff"] = roundtrip_via_transformers(gguf_path, ref)
    except Exception as e:  # noqa: BLE001
        checks["gguf_roundtrip_max_abs_diff"] = None
        checks["gguf_roundtrip_error"] = f"{type(e).__name__}: {e}"
        print(f"  {name}: transformers could not load the GGUF: {e}", file=sys.stderr)
    ll = llamacpp_forward(gguf_path, INPUT_IDS)
    checks["llamacpp_semantics_max_abs_diff"] = float(np.max(np.abs(ll - ref)))
    wrong_mode = "neox" if spec["gguf_arch"] == "llama" else "norm"
    checks["wrong_rope_pairing_max_abs_diff"] = float(
        np.max(np.abs(llamacpp_forward(gguf_path, INPUT_IDS, rope_mode=wrong_mode) - ref))
    )
    if llama3:
        checks["ignoring_rope_freqs_max_abs_diff"] = float(
            np.max(np.abs(llamacpp_forward(gguf_path, INPUT_IDS, use_freq_factors=False) - ref))
        )

    doc = {
        "name": name,
        "arch": spec["gguf_arch"],
        "hf_class": spec["cls"].__name__,
        "gguf_file": gguf_path.name,
        "gguf_sha256": sha256_file(gguf_path),
        "gguf_tensors": shapes,
        "gguf_tensors_note": "tensor name -> GGUF dims (ne, innermost first), all F32, in file order",
        "seed": spec["seed"],
        "init": INIT_NOTE,
        "versions": {
            "python": platform.python_version(),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "gguf": _dist_version("gguf"),
            "numpy": np.__version__,
        },
        "dtype": "float32",
        "attn_implementation": "eager",
        "config": hp,
        "input_ids": INPUT_IDS,
        "greedy_ids": greedy,
        "greedy_min_logit_margin": greedy_margin,
        "greedy_note": f"{GREEDY_NEW} argmax tokens after input_ids, full forward each step, no EOS stopping; "
        "greedy_min_logit_margin: smallest top1-top2 logit gap over those steps",
        **({"rope_freqs": llama3_rope_factors(hp)} if llama3 else {}),
        **checks,
        "logits_note": "logits[i][v]: fp32 HF logits at position i for token v, rounded to 6 significant digits",
        "logits": round_sig(ref),
    }
    jpath = OUT_DIR / f"{name}.json"
    text = json.dumps(doc, separators=(",", ":"))
    # one logits row per line keeps diffs readable
    text = text.replace('"logits":[[', '"logits":[\n[').replace("],[", "],\n[")
    jpath.write_text(text + "\n", encoding="ascii")
    json.loads(jpath.read_text())
    summary = {k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in checks.items() if not k.endswith("note")}
    print(
        f"{name}: {gguf_path.name} {gguf_path.stat().st_size} B, {jpath.name} {jpath.stat().st_size} B, "
        f"logit std {ref.std():.3f}, greedy {greedy} (min margin {greedy_margin:.3g}), {summary}"
    )


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("names", nargs="*", help=f"models to make (default: all of {', '.join(MODELS)})")
    args = ap.parse_args()
    if unknown := [n for n in args.names if n not in MODELS]:
        ap.error(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    torch.set_num_threads(args.threads)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name in args.names or list(MODELS):
        make_one(name, MODELS[name])


if __name__ == "__main__":
    main()
