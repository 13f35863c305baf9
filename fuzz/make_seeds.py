#!/usr/bin/env python3
"""Writes the committed seed corpora under fuzz/seeds/<target>/ (deterministic; rerun after
changing it). Every seed is synthetic and small: tiny GGUF and safetensors files built here,
hand-written tokenizer.json / chat templates / request bodies, and fixed pseudo-random bytes
for the targets whose input is `arbitrary` data.

Usage: python3 fuzz/make_seeds.py
"""
import json
import random
import shutil
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "seeds"


def put(target, name, data):
    d = ROOT / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    assert len(data) <= 8192, (target, name, len(data))
    (d / name).write_bytes(data)


# ---------------------------------------------------------------- GGUF
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gval(t, v):
    fmt = {T_U8: "B", T_I8: "b", T_U16: "H", T_I16: "h", T_U32: "I", T_I32: "i",
           T_F32: "f", T_BOOL: "?", T_U64: "Q", T_I64: "q", T_F64: "d"}
    if t == T_STR:
        return gstr(v)
    if t == T_ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(gval(et, x) for x in items)
    return struct.pack("<" + fmt[t], v)


def gguf(kvs, tensors=(), version=3, align=32):
    """kvs: [(key, type, value)]; tensors: [(name, dims, ggml_type, data)]."""
    h = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        h += gstr(k) + struct.pack("<I", t) + gval(t, v)
    off = 0
    for name, dims, ty, data in tensors:
        h += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        h += struct.pack("<IQ", ty, off)
        off += len(data)
        off = (off + align - 1) // align * align
    h += b"\0" * (-len(h) % align)
    body = b""
    for _, _, _, data in tensors:
        body += data + b"\0" * (-len(data) % align)
    return h + body


def gguf_seeds():
    put("gguf_parse", "empty_v3", gguf([]))
    put("gguf_parse", "empty_v2", gguf([], version=2))
    put("gguf_parse", "all_types", gguf([
        ("general.architecture", T_STR, "llama"),
        ("a.u8", T_U8, 7), ("a.i8", T_I8, -7), ("a.u16", T_U16, 700), ("a.i16", T_I16, -700),
        ("a.u32", T_U32, 70000), ("a.i32", T_I32, -70000), ("a.f32", T_F32, 1.5),
        ("a.bool", T_BOOL, True), ("a.u64", T_U64, 1 << 40), ("a.i64", T_I64, -(1 << 40)),
        ("a.f64", T_F64, 2.25), ("a.strs", T_ARR, (T_STR, ["x", "yz", ""])),
        ("a.nested", T_ARR, (T_ARR, [(T_U8, [1, 2]), (T_F32, [0.5])])),
    ]))
    f32 = struct.pack("<4f", 1, 2, 3, 4)
    put("gguf_parse", "tensors", gguf(
        [("general.architecture", T_STR, "llama"), ("general.alignment", T_U32, 32)],
        [("token_embd.weight", [2, 2], 0, f32), ("output_norm.weight", [2], 1, b"\0<\0<"),
         ("blk.0.attn_q.weight", [32], 8, b"\x00\x3c" + bytes(range(32)))]))
    # gguf_vocab's and tokenizer_json's input is not a GGUF; but a real-looking vocabulary
    # header is a good gguf_parse seed too.
    toks = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "ab", "Ġ", "Ġa"]
    put("gguf_parse", "vocab", gguf([
        ("tokenizer.ggml.model", T_STR, "gpt2"), ("tokenizer.ggml.pre", T_STR, "smollm"),
        ("tokenizer.ggml.tokens", T_ARR, (T_STR, toks)),
        ("tokenizer.ggml.token_type", T_ARR, (T_I32, [3, 3, 3, 1, 1, 1, 1, 1])),
        ("tokenizer.ggml.merges", T_ARR, (T_STR, ["a b", "Ġ a"])),
        ("tokenizer.ggml.bos_token_id", T_U32, 1), ("tokenizer.ggml.eos_token_id", T_U32, 2),
        ("tokenizer.chat_template", T_STR, "{% for m in messages %}{{ m.content }}{% endfor %}"),
    ]))


# ---------------------------------------------------------------- safetensors
def safetensors(tensors, metadata=None, framed=False):
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    data = b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    if framed:  # the target's even framing: u16 header length, header, data
        return b"\x00" + struct.pack("<H", len(text)) + text + data
    return b"\x01" + struct.pack("<Q", len(text)) + text + data


def safetensors_seeds():
    put("safetensors_parse", "one_f32", safetensors([("w", "F32", [2], struct.pack("<2f", 1, 2))]))
    put("safetensors_parse", "one_f32_framed",
        safetensors([("w", "F32", [2], struct.pack("<2f", 1, 2))], framed=True))
    put("safetensors_parse", "many_dtypes_framed", safetensors([
        ("a", "BF16", [2, 1], b"\x80\x3f\x00\x40"), ("b", "I64", [1], struct.pack("<q", -1)),
        ("c", "BOOL", [3], b"\x01\x00\x01"), ("d", "F8_E4M3", [0, 4], b""),
        ("e", "U16", [], b"\x01\x02"),
    ], metadata={"format": "pt"}, framed=True))
    put("safetensors_parse", "empty_header", b"\x01" + struct.pack("<Q", 2) + b"{}")
    put("safetensors_parse", "metadata_only_framed",
        safetensors([], metadata={"a": "b"}, framed=True))


# ---------------------------------------------------------------- tokenizer.json
def tokenizer_json_seeds():
    bl_vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "H": 3, "e": 4, "l": 5,
                "o": 6, "Ġ": 7, "w": 8, "r": 9, "d": 10, "He": 11, "ll": 12, "Ġw": 13}
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for t, i in list(bl_vocab.items())[:3]]
    byte_level = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": bl_vocab, "merges": ["H e", "l l", "Ġ w"]},
    }
    cfg = {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
           "add_bos_token": False,
           "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                            "<|im_end|>\n{% endfor %}"}
    put("tokenizer_json", "bytelevel_bpe.json", json.dumps(byte_level))
    put("tokenizer_json", "bytelevel_bpe_with_config",
        json.dumps(byte_level).encode() + b"\0" + json.dumps(cfg).encode())
    sp_vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x41>": 3, "<0xC3>": 4, "<0xA9>": 5,
                "▁": 6, "a": 7, "b": 8, "▁a": 9, "ab": 10}
    sentencepiece = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for t, i in list(sp_vocab.items())[:3]],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None, "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": sp_vocab, "merges": ["▁ a", "a b"]},
    }
    put("tokenizer_json", "sentencepiece_bpe.json", json.dumps(sentencepiece))
    wordlevel = {"version": "1.0", "added_tokens": [], "normalizer": {"type": "Lowercase"},
                 "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
                 "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
                 "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hello": 1, "world": 2},
                           "unk_token": "[UNK]"}}
    put("tokenizer_json", "wordlevel_other_decoder.json", json.dumps(wordlevel))
    unigram = {"version": "1.0", "added_tokens": [], "normalizer": None,
               "pre_tokenizer": {"type": "Metaspace", "replacement": "▁",
                                 "prepend_scheme": "always", "split": True},
               "post_processor": None,
               "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                           "split": True},
               "model": {"type": "Unigram", "unk_id": 0,
                         "vocab": [["<unk>", 0.0], ["▁", -1.0], ["a", -2.0], ["▁ab", -1.5]],
                         "byte_fallback": False}}
    put("tokenizer_json", "unigram_metaspace.json", json.dumps(unigram))


# ---------------------------------------------------------------- chat templates
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
           "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
           "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
           "{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3_TOOLS = (
    "{{- bos_token }}{%- if tools is not none %}{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}"
    "{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\n\n' }}{%- endfor %}{{- '<|eot_id|>' }}"
    "{%- endif %}{%- for message in messages %}{%- if message.tool_calls is defined and "
    "message.tool_calls %}{%- for c in message.tool_calls %}{{- '{\"name\": \"' + c.function.name + "
    "'\", \"parameters\": ' }}{{- c.function.arguments | tojson }}{{- '}' }}{%- endfor %}"
    "{%- else %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + "
    "message['content'] | trim + '<|eot_id|>' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}")
QWEN_LIKE = (
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + "
    "'<|im_end|>\n' }}{%- endif %}{%- for m in messages %}{%- if m.role == 'tool' %}"
    "{{- '<tool_response>\n' ~ m.content ~ '\n</tool_response>' }}{%- elif m.content is string %}"
    "{{- '<|im_start|>' ~ m.role ~ '\n' ~ m.content.strip() ~ '<|im_end|>\n' }}{%- else %}"
    "{{- raise_exception('bad content') }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")
MISC = (
    "{% set ns = namespace(n=0) %}{% for m in messages|reverse %}{% set ns.n = ns.n + 1 %}"
    "{{ loop.index }}:{{ m.role|upper }} {{ m.content|length }} {{ m.get('name', 'x') }}"
    "{% if m.content.startswith('/') %}{% break %}{% endif %}{% endfor %}{{ strftime_now('%Y-%m-%d %A %j') }}"
    "{{ messages|tojson(sort_keys=true, ensure_ascii=true) }}{{ (messages|map(attribute='role')|list)|join(',') }}"
    "{% for k, v in (tools or {}).items() if tools is mapping %}{{ k }}={{ v }}{% endfor %}{{ ns.n * 'ab' }}")


def rand_bytes(rng, n):
    return bytes(rng.randrange(256) for _ in range(n))


def chat_template_seeds(rng):
    for name, t in [("smollm2", SMOLLM2), ("llama3_tools", LLAMA3_TOOLS), ("qwen_like", QWEN_LIKE),
                    ("misc", MISC), ("loop", "{% for i in range(100000) %}{{ i }}{% endfor %}"),
                    ("real_template", "")]:
        for k in range(2):
            put("chat_template", f"{name}_{k}", t.encode() + b"\0" + rand_bytes(rng, 64 + 96 * k))


# ---------------------------------------------------------------- request bodies
def bodies():
    comp = [
        {"model": "tokenmill", "prompt": "The capital of France is", "max_tokens": 20},
        {"prompt": ["a", "b"], "n": 2, "temperature": 0.7, "top_p": 0.9, "top_k": 40,
         "stop": ["\n", "."], "logprobs": 3, "echo": True, "seed": 1},
        {"prompt": [1, 2, 3], "max_tokens": 5, "stream": True,
         "stream_options": {"include_usage": True}, "logit_bias": {"42": -100}},
        {"prompt": [[1, 2], [3]], "min_tokens": 2, "max_tokens": 3, "ignore_eos": True,
         "stop_token_ids": [2], "include_stop_str_in_output": True,
         "skip_special_tokens": False, "priority": -1},
        {"prompt": "x", "response_format": {"type": "json_object"}},
        {"prompt": "x", "structured_outputs": {"regex": "[a-z]{1,5}"}},
        {"prompt": "x", "guided_choice": ["yes", "no"], "presence_penalty": 1.5,
         "frequency_penalty": -1, "repetition_penalty": 1.1, "min_p": 0.05},
        {"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {
            "name": "s", "schema": {"type": "object", "properties": {"a": {"type": "integer"}},
                                    "required": ["a"]}}}},
        {"prompt": "x", "max_tokens": 100000},
        {"prompt": "x", "guided_grammar": "start: \"a\"+"},
    ]
    chat = [
        {"model": "tokenmill", "messages": [{"role": "user", "content": "Hi!"}]},
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": [{"type": "text", "text": "a"},
                                                   {"type": "text", "text": "b"}]}],
         "logprobs": True, "top_logprobs": 2, "max_completion_tokens": 8},
        {"messages": [{"role": "user", "content": "weather?"},
                      {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "get", "arguments": "{\"city\": \"Paris\"}"}}]},
                      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
         "tools": [{"type": "function", "function": {"name": "get", "description": "d",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
         "tool_choice": "auto"},
        {"messages": [{"role": "user", "content": "x"}],
         "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
         "tool_choice": "required"},
        {"messages": [{"role": "user", "content": "x"}],
         "tools": [{"type": "function", "function": {"name": "f"}}],
         "tool_choice": {"type": "function", "function": {"name": "f"}}},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The"}],
         "continue_final_message": True, "add_generation_prompt": False,
         "chat_template_kwargs": {"enable_thinking": False}},
        {"messages": [{"role": "developer", "content": "x"}], "stream": True,
         "response_format": {"type": "json_object"}, "n": 3},
    ]
    tokenize = [
        {"prompt": "Hello world", "return_token_strs": True},
        {"prompt": "<|im_start|>user", "add_special_tokens": False, "model": "tokenmill"},
        {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True},
    ]
    detokenize = [
        {"tokens": [19556, 28, 905]},
        {"tokens": [1, 2, 3.0], "skip_special_tokens": True},
        {"tokens": [], "model": "other"},
    ]
    return comp, chat, tokenize, detokenize


def body_seeds():
    comp, chat, tok, detok = bodies()
    for i, b in enumerate(comp):
        put("validate_completions", f"completions_{i}.json", b"\x00" + json.dumps(b).encode())
        put("validate_completions", f"generate_{i}.json", b"\x01" + json.dumps(b).encode())
    put("validate_completions", "not_json", b"\x00{\"prompt\": ")
    for i, b in enumerate(chat):
        put("validate_chat", f"chat_{i}.json", json.dumps(b))
    for i, b in enumerate(tok):
        put("tokenize_routes", f"tokenize_{i}.json", b"\x00" + json.dumps(b).encode())
    for i, b in enumerate(detok):
        put("tokenize_routes", f"detokenize_{i}.json", b"\x01" + json.dumps(b).encode())


def arbitrary_seeds(rng):
    for target, sizes in [("gguf_vocab", [64, 256, 1024, 2048]),
                          ("output_assembly", [32, 128, 512, 1024])]:
        for i, n in enumerate(sizes):
            put(target, f"random_{i}", rand_bytes(rng, n))


def main():
    if ROOT.exists():
        shutil.rmtree(ROOT)
    rng = random.Random(21)
    gguf_seeds()
    safetensors_seeds()
    tokenizer_json_seeds()
    chat_template_seeds(rng)
    body_seeds()
    arbitrary_seeds(rng)
    for d in sorted(ROOT.iterdir()):
        print(f"{d.name}: {len(list(d.iterdir()))} seeds")


if __name__ == "__main__":
    main()
