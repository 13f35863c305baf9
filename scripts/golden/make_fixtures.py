#!/usr/bin/env python3
"""Golden reference fixtures for the default model (SmolLM2-135M-Instruct Q4_1 GGUF), made with HF transformers.

Writes tests/fixtures/smollm2/{tokenize,chat,teacher_forced,greedy}.json. CI never runs this script (it needs
torch); it only reads the committed JSON. Regenerate with:

    scripts/golden/setup-venv.sh                      # once: creates the venv with pinned versions
    scripts/fetch-model.sh                            # once: fetches the model into models/
    ~/.cache/tokenmill-golden-venv/bin/python scripts/golden/make_fixtures.py

What the reference is:
  * Tokenizer: `AutoTokenizer.from_pretrained(models_dir, gguf_file=...)`, i.e. the vocabulary, merges, special
    tokens and chat template stored in the GGUF. transformers (5.x) does not know llama.cpp's `smollm`
    pre-tokenizer (`tokenizer.ggml.pre`) and falls back to plain GPT-2 ByteLevel splitting; the real SmolLM2
    tokenizer.json (and llama.cpp's `smollm` pre-tokenizer) first splits every digit on its own
    (`Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)]`). We install that
    pre-tokenizer so the fixtures match the model's real tokenizer; the cases where the GGUF-only fallback would
    differ are counted in tokenize.json (`gguf_fallback_differs`). Decoding uses clean_up_tokenization_spaces=False
    (as SmolLM2's tokenizer_config.json), i.e. exact byte-level decoding.
  * Model: `AutoModelForCausalLM.from_pretrained(models_dir, gguf_file=..., dtype=torch.float32)`. transformers
    dequantizes every tensor (Q4_1 weights, Q8_0 tied embedding) to fp32 and un-permutes Q/K to its rotate_half RoPE
    layout; the forward pass is plain fp32 (eager attention). Logprobs are log_softmax of the raw fp32 logits.
  * Greedy: our own argmax loop over full forward passes (no KV cache), exactly 32 new tokens, NO EOS stopping (if
    the argmax is <|im_end|> it is appended and generation goes on), no logits processors, so the recorded top-5
    are raw-logit logprobs. The prefix before the first EOS is cross-checked against `model.generate(do_sample=False)`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import pre_tokenizers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT_DIR = ROOT / "tests" / "fixtures" / "smollm2"
TOPK = 5
GREEDY_NEW_TOKENS = 32
LP_DECIMALS = 6

# --------------------------------------------------------------------------------------------------------------
# Inputs

TOKENIZE_TEXTS: list[str] = [
    # ASCII prose and whitespace
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "The capital of France is",
    "  leading spaces",
    "trailing spaces   ",
    "multiple    internal     spaces",
    " ",
    "",
    "   ",
    "\t\ttabs\tand\nnewlines\n\n\nruns\r\n",
    "\n\n\n",
    "  \n  \n",
    "I'm sure they'll say it's fine; don't you think? We've seen it, I'd say.",
    "I'M SURE IT'S FINE, WE'VE DONE IT. You'Re OK",
    "Wait... what?!?! ---- ==== **** ''''' \"\"\" ``` ",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa !!!!!!!!!!!!!!!!!!",
    # digits and numbers (SmolLM2 splits every digit)
    "1234567890",
    "3.14159 2.71828 -42 +7 1e-10 0x1F 007",
    "The year 2024 had 366 days; 1,000,000 people and 12345678901234567890.",
    "Total:   42",
    "x  5\n  7\t\t8",
    "abc123def 4x4 v2.0.1 COVID-19 3rd 21st",
    # code
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    'fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!("{:?}", v);\n}\n',
    '{"name": "tokenmill", "version": [0, 1, 2], "ok": true, "nested": {"a": null, "b": -1.5e3}}',
    "# Title\n\n- item one\n- item **two**\n\n```rust\nlet x = 1;\n```\n",
    '<div class="a">Hello &amp; <b>bye</b></div>',
    # URLs, paths
    "https://example.com/path/to/page?query=rust&lang=en#section-2",
    "user.name+tag@example.org /usr/local/bin/python3 C:\\Windows\\System32",
    # scripts
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ、ひらがな。東京は大きい。",
    "안녕하세요, 세계! 한국어 텍스트입니다.",
    "مرحبا بالعالم! هذا اختبار.",
    "שלום עולם! זהו מבחן.",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "नमस्ते दुनिया! यह एक परीक्षण है।",
    "สวัสดีชาวโลก นี่คือการทดสอบ",
    "Καλημέρα κόσμε",
    "Tiếng Việt có dấu",
    # emoji
    "I love 🦀 and 🐍! 😀😃😄",
    "Family: 👨‍👩‍👧‍👦 and 👩‍💻 🏳️‍🌈",
    "Flags: 🇫🇷 🇯🇵 🇺🇸 🇧🇷",
    "Wave 👋🏽 thumbs 👍🏿 ok 👌🏻",
    # combining accents vs precomposed, odd spaces
    "e\u0301 a\u0308 n\u0303 | \u00e9 \u00e4 \u00f1",
    "Café naïve résumé façade Ångström Zürich",
    "non\u00a0breaking\u2003em\u3000ideographic space",
    "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom",
    "∀x ∈ ℝ: x² ≥ 0 ∑∫√∞ ≠ ≈ ± × ÷ → ⇒",
    "ctrl\x07bell \x1b[0m escape",
    # chat markers / special tokens
    "<|im_start|>user\nhi<|im_end|>",
    "<|endoftext|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "text before<|endoftext|>text after",
    "<|im_start| <im_start> < |im_end| >",
    # mixed scripts
    "Rust (ラスト) is 快速 and безопасный 🚀 — ✓",
    # llama.cpp's pre-tokenizer check text (convert_hf_to_gguf.py chktxt)
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 "
    "33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на "
    "Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll "
    "make it, 'D you like some tea? We'Ve a'lL",
]

CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a pirate. Answer briefly."},
        {"role": "user", "content": "How are you today?"},
    ],
    [
        {"role": "user", "content": "Hi! Can you add 2 and 3?"},
        {"role": "assistant", "content": "Sure: 2 + 3 = 5."},
        {"role": "user", "content": "And times 4?"},
    ],
    [
        {"role": "system", "content": "Tu es un traducteur. 🇫🇷→🇯🇵"},
        {"role": "user", "content": "Traduis « bonjour » en japonais."},
        {"role": "assistant", "content": "こんにちは (konnichiwa)"},
        {"role": "user", "content": "Merci ! 😀 Et en coréen ? 안녕하세요?"},
    ],
    [{"role": "user", "content": ""}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}],
    [{"role": "user", "content": "```python\nprint('hi')\n```\nExplain this.\n\n"}],
]

TEACHER_FORCED_PASSAGES: list[tuple[str, str]] = [
    (
        "english",
        "The history of the printing press is a story of small improvements that added up to a revolution. "
        "Before Johannes Gutenberg built his press in Mainz around 1440, books in Europe were copied by hand, "
        "usually by monks working in quiet scriptoria. A single Bible could take a scribe more than a year to "
        "finish, and the cost of such a book was far beyond the reach of ordinary people. Gutenberg combined "
        "several existing ideas: movable metal type, an oil-based ink that stuck to metal, and a screw press "
        "adapted from the ones used to make wine. Within fifty years, printers in more than two hundred cities "
        "had produced millions of volumes. Ideas that once travelled slowly now spread across the continent in "
        "months, and scholars could compare identical copies of the same text for the first time.",
    ),
    (
        "code_and_french",
        "def mean(xs):\n    return sum(xs) / len(xs)\n\nprint(mean([1, 2, 3]))  # 2.0\n"
        "Le chat dort sur le canapé pendant que la pluie tombe doucement.",
    ),
]

GREEDY_PROMPTS: list[tuple[str, object]] = [
    ("capital_france", "The capital of France is"),
    ("chat_capital", [{"role": "user", "content": "What is the capital of France?"}]),
    ("chat_haiku", [{"role": "user", "content": "Write a haiku about the sea."}]),
    ("code_python", "def is_prime(n):\n"),
    ("code_rust", "fn main() {\n    println!("),
    ("numbers", "1, 2, 3, 4, 5,"),
    ("french", "La capitale de la France est"),
    ("chinese", "中国的首都是"),
    ("story", "Once upon a time, in a small village,"),
    ("json", '{"name": "Alice", "age":'),
    ("hello", "Hello"),
    ("fox", "The quick brown fox"),
]


# --------------------------------------------------------------------------------------------------------------
# Helpers


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "tokenizers": tokenizers.__version__,
        "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf"),
        "numpy": np.__version__,
    }


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def write_fixture(path: Path, header: dict, list_key: str, items: list) -> None:
    """Compact JSON: header keys one per line, then one list item per line (ASCII-escaped, so no editor can
    normalize the Unicode test strings)."""
    lines = ["{"]
    for k, v in header.items():
        lines.append(f" {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))},")
    lines.append(f" {json.dumps(list_key)}: [")
    body = [" " + json.dumps(it, separators=(",", ":")) for it in items]
    lines.append(",\n".join(body))
    lines.append(" ]")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n", encoding="ascii")
    json.loads(path.read_text())  # sanity: valid JSON
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size} bytes, {len(items)} {list_key})")


def topk_pairs(logprobs_row: torch.Tensor, k: int = TOPK) -> list[list]:
    vals, idx = torch.topk(logprobs_row, k)
    return [[int(i), round(float(v), LP_DECIMALS)] for v, i in zip(vals, idx)]


def load_tokenizer(model_path: Path):
    tok = AutoTokenizer.from_pretrained(str(model_path.parent), gguf_file=model_path.name)
    fallback_pre = tok.backend_tokenizer.pre_tokenizer
    # SmolLM2's tokenizer.json pre-tokenizer (== llama.cpp's `smollm` pre-tokenizer type).
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    return tok, fallback_pre


def encode(tok, text: str, add_special_tokens: bool) -> list[int]:
    return list(tok(text, add_special_tokens=add_special_tokens)["input_ids"])


def decode(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


# --------------------------------------------------------------------------------------------------------------
# Fixture builders


def make_tokenize(tok, fallback_pre, header: dict) -> None:
    import copy

    fallback = copy.deepcopy(tok.backend_tokenizer)
    fallback.pre_tokenizer = fallback_pre
    cases = []
    n_diff = 0
    for text in TOKENIZE_TEXTS:
        ids = encode(tok, text, True)
        ids_ns = encode(tok, text, False)
        dec = decode(tok, ids)
        fb_ids = fallback.encode(text, add_special_tokens=True).ids
        if fb_ids != ids:
            n_diff += 1
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_no_special": ids_ns,
                "decoded": dec,
                "roundtrip": dec == text,
            }
        )
    hdr = dict(header)
    hdr["note"] = (
        "ids: tok(text, add_special_tokens=True); ids_no_special: add_special_tokens=False (identical for this model: "
        "tokenizer.ggml.add_bos_token is false); decoded: tok.decode(ids, skip_special_tokens=False, "
        "clean_up_tokenization_spaces=False); roundtrip: decoded == text (false where the vocabulary lacks a byte, "
        "which HF's BPE drops). Special tokens in the text (e.g. <|im_start|>) are matched as specials."
    )
    hdr["pre_tokenizer"] = "Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)]"
    hdr["gguf_fallback_differs"] = n_diff
    write_fixture(OUT_DIR / "tokenize.json", hdr, "cases", cases)


def make_chat(tok, header: dict) -> None:
    cases = []
    for messages in CONVERSATIONS:
        for agp in (True, False):
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=agp)
            cases.append(
                {
                    "messages": messages,
                    "add_generation_prompt": agp,
                    "text": text,
                    "ids": encode(tok, text, False),
                }
            )
    hdr = dict(header)
    hdr["chat_template"] = tok.chat_template
    hdr["note"] = (
        "text: tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=...) with the GGUF's "
        "tokenizer.chat_template; ids: tok(text, add_special_tokens=False)"
    )
    write_fixture(OUT_DIR / "chat.json", hdr, "cases", cases)


@torch.no_grad()
def logprobs_of(model, ids: list[int]) -> torch.Tensor:
    out = model(torch.tensor([ids], dtype=torch.long))
    return torch.log_softmax(out.logits[0].float(), dim=-1)


def make_teacher_forced(model, tok, header: dict) -> None:
    cases = []
    for name, text in TEACHER_FORCED_PASSAGES:
        ids = encode(tok, text, True)
        lp = logprobs_of(model, ids)
        top5 = [topk_pairs(lp[i]) for i in range(len(ids))]
        target = [round(float(lp[i, ids[i + 1]]), LP_DECIMALS) for i in range(len(ids) - 1)]
        nll = -sum(target) / len(target)
        cases.append(
            {
                "name": name,
                "text": text,
                "input_ids": ids,
                "top5": top5,
                "target_logprobs": target,
                "mean_nll": round(nll, LP_DECIMALS),
            }
        )
        print(f"  teacher_forced {name}: {len(ids)} tokens, mean NLL {nll:.4f}, ppl {np.exp(nll):.2f}")
    hdr = dict(header)
    hdr["note"] = (
        "One fp32 forward pass over input_ids. top5[i]: the 5 largest [token_id, logprob] of "
        "log_softmax(logits[i]) (the prediction for position i+1), in descending order. target_logprobs[i]: "
        "logprob of input_ids[i+1] at position i. mean_nll: -mean(target_logprobs)."
    )
    write_fixture(OUT_DIR / "teacher_forced.json", hdr, "cases", cases)


EMBEDDING_TEXTS = [
    ("sentence", "The quick brown fox jumps over the lazy dog."),
    ("word", "Hello"),
    ("question", "What is the capital of France? Answer in one word."),
    ("code", "def add(a, b):\n    return a + b\n\nprint(add(2, 3))"),
    ("chinese", "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u5427\u3002"),
    ("paragraph", TEACHER_FORCED_PASSAGES[0][1]),
]


@torch.no_grad()
def make_embeddings(model, tok, header: dict) -> None:
    cases = []
    for name, text in EMBEDDING_TEXTS:
        ids = encode(tok, text, True)
        hidden = model.model(torch.tensor([ids], dtype=torch.long)).last_hidden_state[0].float()
        pooled = {"mean": hidden.mean(dim=0), "last": hidden[-1]}
        case = {"name": name, "text": text, "input_ids": ids}
        for kind, v in pooled.items():
            v = torch.nn.functional.normalize(v, dim=0)
            case[kind] = [round(float(x), 6) for x in v]
        cases.append(case)
        print(f"  embeddings {name}: {len(ids)} tokens")
    hdr = dict(header)
    hdr["note"] = (
        "One fp32 forward pass over input_ids (add_special_tokens=True); last_hidden_state is after the final "
        "norm. mean: the mean over every position, last: the last position's; both L2-normalised."
    )
    write_fixture(OUT_DIR / "embeddings.json", hdr, "cases", cases)


@torch.no_grad()
def make_greedy(model, tok, header: dict) -> None:
    eos = tok.eos_token_id
    cases = []
    for name, prompt in GREEDY_PROMPTS:
        if isinstance(prompt, list):
            text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            kind = "chat"
        else:
            text = prompt
            kind = "text"
        prompt_ids = encode(tok, text, True)
        ids = list(prompt_ids)
        gen, top5, chosen_lp = [], [], []
        for _ in range(GREEDY_NEW_TOKENS):
            logits = model(torch.tensor([ids], dtype=torch.long)).logits[0, -1].float()
            lp = torch.log_softmax(logits, dim=-1)
            nxt = int(torch.argmax(logits))
            gen.append(nxt)
            top5.append(topk_pairs(lp))
            chosen_lp.append(round(float(lp[nxt]), LP_DECIMALS))
            ids.append(nxt)
        first_eos = gen.index(eos) if eos in gen else None
        # Cross-check against HF generate (greedy) up to the first EOS.
        ref = model.generate(
            torch.tensor([prompt_ids], dtype=torch.long),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=GREEDY_NEW_TOKENS,
            pad_token_id=eos,
        )[0, len(prompt_ids):].tolist()
        upto = first_eos + 1 if first_eos is not None else GREEDY_NEW_TOKENS
        agrees = ref[:upto] == gen[:upto]
        if not agrees:
            print(f"  WARNING: {name}: HF generate differs: {ref} vs {gen}", file=sys.stderr)
        margins = [round(s[0][1] - s[1][1], LP_DECIMALS) for s in top5]
        cases.append(
            {
                "name": name,
                "kind": kind,
                "prompt": prompt,
                "prompt_text": text,
                "prompt_ids": prompt_ids,
                "generated_ids": gen,
                "generated_text": decode(tok, gen),
                "first_eos_index": first_eos,
                "hf_generate_agrees": agrees,
                "min_top1_top2_margin": min(margins),
                "chosen_logprobs": chosen_lp,
                "top5": top5,
            }
        )
        print(f"  greedy {name}: {decode(tok, gen)!r} (eos at {first_eos}, min margin {min(margins):.4f})")
    hdr = dict(header)
    hdr["new_tokens"] = GREEDY_NEW_TOKENS
    hdr["eos_token_id"] = eos
    hdr["note"] = (
        "prompt_ids: tok(prompt_text, add_special_tokens=True) (chat prompts rendered with the chat template, "
        "add_generation_prompt=True). generated_ids: exactly 32 greedy (argmax of raw fp32 logits) tokens, each step a "
        "full forward pass over prompt+generated so far; EOS does NOT stop generation (it is appended like any token; "
        "first_eos_index tells where it first appears). top5[j]: the 5 largest [token_id, logprob] of "
        "log_softmax(logits) at generation step j (no logits processors). hf_generate_agrees: model.generate("
        "do_sample=False) produced the same tokens up to and including the first EOS. min_top1_top2_margin: the "
        "smallest logprob gap between the top two candidates over the 32 steps (small values = near-ties, where a "
        "quantized implementation may legitimately diverge)."
    )
    write_fixture(OUT_DIR / "greedy.json", hdr, "cases", cases)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="GGUF file (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", nargs="*", choices=["tokenize", "chat", "teacher_forced", "greedy", "embeddings"])
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model_path = args.model.resolve()
    if not model_path.is_file():
        sys.exit(f"model not found: {model_path} (run scripts/fetch-model.sh)")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    header = {
        "model": model_path.name,
        "model_sha256": sha256_file(model_path),
        "transformers_version": transformers.__version__,
        "versions": versions(),
        "generator": "scripts/golden/make_fixtures.py",
    }
    only = set(args.only or ["tokenize", "chat", "teacher_forced", "greedy", "embeddings"])
    tok, fallback_pre = load_tokenizer(model_path)
    if "tokenize" in only:
        make_tokenize(tok, fallback_pre, header)
    if "chat" in only:
        make_chat(tok, header)
    if only & {"teacher_forced", "greedy", "embeddings"}:
        model = AutoModelForCausalLM.from_pretrained(
            str(model_path.parent), gguf_file=model_path.name, dtype=torch.float32, attn_implementation="eager"
        )
        model.eval()
        header = dict(header, dtype="float32", attn_implementation="eager")
        if "teacher_forced" in only:
            make_teacher_forced(model, tok, header)
        if "greedy" in only:
            make_greedy(model, tok, header)
        if "embeddings" in only:
            make_embeddings(model, tok, header)
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
