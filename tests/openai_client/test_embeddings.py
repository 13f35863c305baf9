"""The official `openai` Python client's embeddings against a running `tokenmill serve`.

Usage: python test_embeddings.py BASE_URL MODEL POOLING

POOLING (`last` or `mean`) is how the server was started (`--pooling`). The vectors are checked
against HF transformers' (tests/fixtures/smollm2/embeddings.json: fp32, same weights, same
pooling); then base64 (the client's default) against float, several inputs and token ids,
usage against /tokenize, `dimensions`, `truncate_prompt_tokens` and errors. Runs without
pytest; prints one line per test and a closing `N passed, M failed`.
"""

import json
import math
import pathlib
import sys
import urllib.request

import openai
from openai import OpenAI

from harness import main, test

BASE, MODEL, POOLING = sys.argv[1], sys.argv[2], sys.argv[3]
client = OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=120)
FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures/smollm2/embeddings.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def token_count(text):
    req = urllib.request.Request(BASE + "/tokenize", data=json.dumps({"prompt": text}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.load(r)["count"]


def bad_request(param, **kwargs):
    try:
        client.embeddings.create(model=MODEL, **kwargs)
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == param, (e.status_code, e.body)
        return e.body["message"]
    raise AssertionError(f"no 400 for {kwargs}")


@test
def vectors_match_hf_transformers():
    r = client.embeddings.create(model=MODEL, input=[c["text"] for c in CASES],
                                 encoding_format="float")
    assert r.object == "list" and r.model == MODEL, r
    assert [d.index for d in r.data] == list(range(len(CASES)))
    for case, d in zip(CASES, r.data):
        assert d.object == "embedding" and len(d.embedding) == len(case[POOLING])
        cos = cosine(d.embedding, case[POOLING])
        assert cos > 0.99999, (case["name"], cos)
        norm = math.sqrt(sum(x * x for x in d.embedding))
        assert abs(norm - 1) < 1e-5, norm


@test
def base64_the_clients_default_decodes_to_the_same_floats():
    text = CASES[0]["text"]
    floats = client.embeddings.create(model=MODEL, input=text, encoding_format="float")
    default = client.embeddings.create(model=MODEL, input=text)
    a, b = floats.data[0].embedding, default.data[0].embedding
    assert len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) < 1e-6


@test
def token_ids_and_usage():
    case = CASES[2]
    by_ids = client.embeddings.create(model=MODEL, input=[case["input_ids"]] * 2,
                                      encoding_format="float")
    assert len(by_ids.data) == 2
    assert cosine(by_ids.data[0].embedding, case[POOLING]) > 0.99999
    assert by_ids.usage.prompt_tokens == 2 * len(case["input_ids"])
    assert by_ids.usage.total_tokens == by_ids.usage.prompt_tokens
    texts = ["one", "two words", "and three words"]
    r = client.embeddings.create(model=MODEL, input=texts)
    assert r.usage.prompt_tokens == sum(token_count(t) for t in texts)


@test
def dimensions_only_as_the_models_width():
    width = len(CASES[0][POOLING])
    r = client.embeddings.create(model=MODEL, input="hi", dimensions=width)
    assert len(r.data[0].embedding) == width
    message = bad_request("dimensions", input="hi", dimensions=64)
    assert str(width) in message, message


@test
def truncate_prompt_tokens_keeps_the_last_tokens():
    case = CASES[-1]
    k = 20
    r = client.embeddings.create(model=MODEL, input=case["text"], encoding_format="float",
                                 extra_body={"truncate_prompt_tokens": k})
    tail = client.embeddings.create(model=MODEL, input=case["input_ids"][-k:],
                                    encoding_format="float")
    assert r.usage.prompt_tokens == k
    assert cosine(r.data[0].embedding, tail.data[0].embedding) > 0.99999


@test
def bad_inputs_are_400s_naming_the_parameter():
    bad_request("input", input="")
    bad_request("input", input=[])
    bad_request("input", input=[[1, 2], "text"])
    bad_request("input", input=[10**9])
    bad_request("input", input="word " * 3000)
    bad_request("encoding_format", input="hi", extra_body={"encoding_format": "int8"})
    bad_request("truncate_prompt_tokens", input="hi", extra_body={"truncate_prompt_tokens": 0})
    try:
        client.embeddings.create(model="no-such-model", input="hi")
    except openai.NotFoundError as e:
        assert e.status_code == 404
    else:
        raise AssertionError("no 404 for an unknown model")


main()
