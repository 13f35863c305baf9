"""The official `openai` Python client against a running `tokenmill serve`.

Usage: python test_openai.py BASE_URL MODEL

Covers completions and chat, streaming and not, logprobs, n > 1, stop, seed, usage and
errors. Runs without pytest; prints one line per test and a closing `N passed, M failed`.
"""

import sys

import openai
from openai import OpenAI

from harness import main, test

BASE, MODEL = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=120)


def complete(**kw):
    args = dict(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0,
                extra_body={"ignore_eos": True})
    args.update(kw)
    return client.completions.create(**args)


def chat(**kw):
    args = dict(model=MODEL, messages=[{"role": "user", "content": "Say hello in French."}],
                max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    args.update(kw)
    return client.chat.completions.create(**args)


@test
def models():
    ids = [m.id for m in client.models.list().data]
    assert MODEL in ids, ids


@test
def completion_with_usage():
    r = complete()
    assert r.object == "text_completion"
    assert len(r.choices) == 1 and r.choices[0].text
    assert r.choices[0].finish_reason == "length"
    u = r.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (5, 8, 13), u


@test
def completion_stream_matches():
    full = complete().choices[0].text
    text, usage, finishes = "", None, []
    for chunk in complete(stream=True, stream_options={"include_usage": True}):
        for ch in chunk.choices:
            text += ch.text
            if ch.finish_reason:
                finishes.append(ch.finish_reason)
        if chunk.usage:
            usage = chunk.usage
    assert text == full, (text, full)
    assert finishes == ["length"], finishes
    assert usage is not None and usage.completion_tokens == 8, usage


@test
def completion_logprobs():
    r = complete(max_tokens=4, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4 and len(lp.token_logprobs) == 4
    assert all(x <= 0 for x in lp.token_logprobs)
    assert all(1 <= len(t) <= 3 for t in lp.top_logprobs), lp.top_logprobs
    assert "".join(lp.tokens) == r.choices[0].text


@test
def completion_n_and_seed():
    kw = dict(prompt="Once upon a time", n=3, seed=11, temperature=1.0, max_tokens=6)
    a, b = complete(**kw), complete(**kw)
    ta = [c.text for c in sorted(a.choices, key=lambda c: c.index)]
    tb = [c.text for c in sorted(b.choices, key=lambda c: c.index)]
    assert len(ta) == 3 and ta == tb, (ta, tb)
    assert a.usage.completion_tokens == 18


@test
def completion_stop():
    full = complete(max_tokens=16).choices[0].text
    mid = len(full) // 2
    stop = full[mid:mid + 3]
    r = complete(max_tokens=16, stop=[stop])
    assert r.choices[0].text == full[:full.index(stop)], (full, stop, r.choices[0].text)
    assert r.choices[0].finish_reason == "stop"


@test
def chat_with_usage():
    r = chat()
    m = r.choices[0].message
    assert r.object == "chat.completion" and m.role == "assistant" and m.content, r
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens > 5


@test
def chat_stream_matches():
    full = chat().choices[0].message.content
    text, usage, finish = "", None, None
    for chunk in chat(stream=True, stream_options={"include_usage": True}):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert text == full, (text, full)
    assert finish == "length" and usage.completion_tokens == 8


@test
def chat_logprobs():
    r = chat(max_tokens=3, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == 3
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


@test
def chat_n_seed_stop():
    kw = dict(n=2, seed=5, temperature=0.9, max_tokens=6)
    a, b = chat(**kw), chat(**kw)
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    r = chat(max_tokens=16, stop=["\n", "."])
    assert r.choices[0].finish_reason in ("stop", "length")
    assert "\n" not in r.choices[0].message.content


@test
def errors_are_typed():
    try:
        complete(temperature=-1)
        raise AssertionError("no error")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == "temperature", e.body
    try:
        complete(model="no-such-model")
        raise AssertionError("no error")
    except openai.NotFoundError as e:
        assert e.status_code == 404


if __name__ == "__main__":
    main()
