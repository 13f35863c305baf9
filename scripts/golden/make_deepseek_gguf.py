#!/usr/bin/env python3
"""The tiny DeepSeek V2 / V3 fixtures as F32 GGUF files written by llama.cpp's own converter.

For each folder made by make_deepseek_models.py (tests/fixtures/deepseek/<name>/), runs the vendored
llama.cpp `convert_hf_to_gguf.py --outtype f32` and writes tests/fixtures/deepseek/<name>/model.f32.gguf. The
tests compare the GGUF models against the same reference.json as the HF folders (the weights are identical).
CI never runs this; it only reads the files.

    ~/.cache/tokenmill-golden-venv/bin/python scripts/golden/make_deepseek_gguf.py [v2 v3]

llama.cpp: LLAMA_CPP_DIR, default ~/.cache/tokenmill-peers/llama_cpp_python-0.3.36/vendor/llama.cpp (the source
that ../shared/peers/llama-cpp.sh unpacks); its gguf-py is put first on sys.path.

Two inputs differ from the committed HF folder, both on a temporary copy:
  * v3 config.json gains `"scoring_func": "sigmoid", "topk_method": "noaux_tc"`, as the real DeepSeek-V3
    config.json has (transformers 5.24's DeepseekV3Config does not save them). Without scoring_func the converter
    writes no `expert_gating_func` and llama.cpp would route V3 by softmax. v2 keeps no scoring_func, so its GGUF
    exercises the "absent = softmax" default of llama.cpp's deepseek2 loader.
  * the tiny byte-level tokenizer's pre-tokenizer hash is not in the converter's table, so its
    `get_vocab_base_pre` would refuse it; the script answers "gpt-2" (a GPT-2 ByteLevel regex split, which is
    exactly what tokenizer.json says) -- what registering the hash in convert_hf_to_gguf_update.py would do.

After converting, every GGUF tensor is read back with gguf-py and checked against the safetensors weights under
the converter's naming: experts stacked into one 3-D tensor per projection, kv_b_proj split per head into
attn_k_b (transposed, [H, kv_lora_rank, nope]) and attn_v_b ([H, v, kv_lora_rank]).

The tiny tokenizer has no BPE merges, so the converter writes no `tokenizer.ggml.merges` (gguf-py cannot write an
empty array) and llama.cpp refuses to load the file ("cannot find tokenizer merges"). `--llama-server` checks the
GGUFs against llama.cpp itself anyway: a temporary copy with one unused merge added is served by the peer's
llama-server (build/bin under LLAMA_CPP_DIR), and its greedy continuation of reference.json's input_ids must equal
the HF greedy_ids.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "tests" / "fixtures" / "deepseek"
LLAMA_CPP = Path(
    os.environ.get("LLAMA_CPP_DIR", "~/.cache/tokenmill-peers/llama_cpp_python-0.3.36/vendor/llama.cpp")
).expanduser()
sys.path[:0] = [str(LLAMA_CPP / "gguf-py"), str(LLAMA_CPP)]

import numpy as np  # noqa: E402
import gguf  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

import convert_hf_to_gguf  # noqa: E402
from conversion import base  # noqa: E402

EXTRA_CONFIG = {"v2": {}, "v3": {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}}

_orig_pre = base.TextModel.get_vocab_base_pre


def _vocab_base_pre(self, tokenizer) -> str:  # noqa: ANN001
    try:
        return _orig_pre(self, tokenizer)
    except NotImplementedError:
        return "gpt-2"


def convert(name: str) -> Path:
    src = OUT_DIR / name
    out = src / "model.f32.gguf"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / name
        shutil.copytree(src, work, ignore=shutil.ignore_patterns("*.gguf", "reference.json"))
        cfg = json.loads((work / "config.json").read_text())
        cfg.update(EXTRA_CONFIG[name])
        (work / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        base.TextModel.get_vocab_base_pre = _vocab_base_pre
        argv = sys.argv
        sys.argv = ["convert_hf_to_gguf.py", str(work), "--outtype", "f32", "--outfile", str(out)]
        try:
            convert_hf_to_gguf.main()
        finally:
            sys.argv = argv
            base.TextModel.get_vocab_base_pre = _orig_pre
    return out


def expected_tensors(st: dict[str, np.ndarray], cfg: dict) -> dict[str, np.ndarray]:
    """The safetensors weights under the converter's GGUF names and layout (PyTorch order)."""
    h, nope, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    attn = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
            "self_attn.q_a_proj": "attn_q_a", "self_attn.q_a_layernorm": "attn_q_a_norm",
            "self_attn.q_b_proj": "attn_q_b", "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
            "self_attn.kv_a_layernorm": "attn_kv_a_norm", "self_attn.o_proj": "attn_output",
            "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
            "mlp.gate": "ffn_gate_inp", "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
            "mlp.shared_experts.up_proj": "ffn_up_shexp", "mlp.shared_experts.down_proj": "ffn_down_shexp"}
    want = {"token_embd.weight": st["model.embed_tokens.weight"], "output_norm.weight": st["model.norm.weight"],
            "output.weight": st["lm_head.weight"]}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        for hf, gg in attn.items():
            if p + hf + ".weight" in st:
                want[f"blk.{layer}.{gg}.weight"] = st[p + hf + ".weight"]
        if p + "mlp.gate.e_score_correction_bias" in st:
            want[f"blk.{layer}.exp_probs_b.bias"] = st[p + "mlp.gate.e_score_correction_bias"]
        kv_b = st[p + "self_attn.kv_b_proj.weight"].reshape(h, nope + v, -1)
        want[f"blk.{layer}.attn_k_b.weight"] = kv_b[:, :nope, :].transpose(0, 2, 1)
        want[f"blk.{layer}.attn_v_b.weight"] = kv_b[:, nope:, :]
        n_exp = cfg["n_routed_experts"]
        if p + "mlp.experts.0.gate_proj.weight" in st:
            for proj, gg in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
                want[f"blk.{layer}.{gg}.weight"] = np.stack(
                    [st[f"{p}mlp.experts.{e}.{proj}.weight"] for e in range(n_exp)])
    return want


def check(name: str, path: Path) -> None:
    cfg = json.loads((OUT_DIR / name / "config.json").read_text())
    st = load_file(str(OUT_DIR / name / "model.safetensors"))
    want = expected_tensors(st, cfg)
    reader = gguf.GGUFReader(str(path))
    got = {t.name: t for t in reader.tensors}
    assert set(got) == set(want), (sorted(set(got) ^ set(want)))
    for n, t in got.items():
        assert t.tensor_type == gguf.GGMLQuantizationType.F32, n
        shape = tuple(int(d) for d in reversed(t.shape))
        assert shape == want[n].shape, (n, shape, want[n].shape)
        assert np.array_equal(np.asarray(t.data).reshape(shape), want[n]), n
    keys = {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("tokenizer.ggml.")
            or f.name in ("tokenizer.ggml.model", "tokenizer.ggml.pre")}
    keys.pop("GGUF.kv_count", None)
    print(f"{name}: {path.stat().st_size} B, {len(got)} tensors equal the safetensors weights")
    for k, v in sorted(keys.items()):
        print(f"  {k} = {v}")


def llama_server_greedy(name: str, path: Path, port: int) -> None:
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    ref = json.loads((OUT_DIR / name / "reference.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        served = Path(tmp) / "model.gguf"
        reader = gguf.GGUFReader(str(path), "r")
        writer = gguf.GGUFWriter(str(served), arch="deepseek2", endianess=reader.endianess)
        merges = MetadataDetails(gguf.GGUFValueType.ARRAY, ["\u0100 \u0101"], gguf.GGUFValueType.STRING)
        copy_with_new_metadata(reader, writer, {"tokenizer.ggml.merges": merges}, [])
        server = LLAMA_CPP / "build" / "bin" / "llama-server"
        log = open(Path(tmp) / "server.log", "w")
        proc = subprocess.Popen([str(server), "-m", str(served), "--port", str(port), "-t", "1", "-c", "256"],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(240):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health").read()
                    break
                except OSError:
                    if proc.poll() is not None:
                        raise SystemExit(f"{name}: llama-server exited: {(Path(tmp) / 'server.log').read_text()}")
                    time.sleep(0.5)
            body = {"prompt": ref["input_ids"], "n_predict": len(ref["greedy_ids"]), "temperature": 0,
                    "samplers": ["top_k"], "top_k": 1, "return_tokens": True, "cache_prompt": False}
            req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                         {"content-type": "application/json"})
            got = json.loads(urllib.request.urlopen(req).read())["tokens"]
        finally:
            proc.terminate()
            proc.wait()
    assert got == ref["greedy_ids"], (name, got, ref["greedy_ids"])
    print(f"{name}: llama-server greedy {got} == HF greedy_ids")


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--llama-server"]
    for i, name in enumerate(args or list(EXTRA_CONFIG)):
        path = convert(name)
        check(name, path)
        if "--llama-server" in sys.argv:
            llama_server_greedy(name, path, 18790 + i)


if __name__ == "__main__":
    main()
