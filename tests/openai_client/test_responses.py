"""The official `openai` Python client's Responses API against a running `tokenmill serve`.

Usage: python test_responses.py BASE_URL MODEL

Covers `responses.create` (string and message input, instructions, `max_output_tokens`,
usage), `responses.stream` (the event sequence and the final response), `previous_response_id`
across turns, `responses.retrieve`, and errors. Runs without pytest; prints one line per test
and a closing `N passed, M failed`.
"""

import json
import sys

import openai
from openai import OpenAI

from harness import main, test

BASE, MODEL = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat_text(messages, max_tokens):
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens,
                                       temperature=0)
    return r.choices[0].message.content


@test
def create_with_a_string_input_is_the_chat_reply():
    r = client.responses.create(model=MODEL, input="What is the capital of France?",
                                max_output_tokens=12, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_"), r
    assert r.status in ("completed", "incomplete"), r.status
    want = chat_text([{"role": "user", "content": "What is the capital of France?"}], 12)
    assert r.output_text == want, (r.output_text, want)
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.usage.output_tokens <= 12 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


@test
def max_output_tokens_makes_it_incomplete():
    r = client.responses.create(model=MODEL, input="Write a long story about a dragon.",
                                max_output_tokens=5, temperature=0)
    assert r.status == "incomplete", r.status
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5


@test
def instructions_and_message_input():
    msgs = [{"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]}]
    r = client.responses.create(model=MODEL, instructions="Answer in one word.", input=msgs,
                                max_output_tokens=8, temperature=0)
    want = chat_text([{"role": "system", "content": "Answer in one word."},
                      {"role": "user", "content": "Name a colour."}], 8)
    assert r.output_text == want, (r.output_text, want)
    assert r.instructions == "Answer in one word."


@test
def stream_events_build_the_same_text():
    # A reply cut by max_output_tokens ends with response.incomplete, one that stops by itself
    # with response.completed (which the SDK's get_final_response needs).
    for kw, last in [
        (dict(input="Tell me about Paris.", max_output_tokens=16), "response.incomplete"),
        (dict(input="Say hi.", max_output_tokens=200), "response.completed"),
    ]:
        kw.update(model=MODEL, temperature=0)
        with client.responses.stream(**kw) as s:
            events = []
            try:
                for e in s:
                    events.append(e)
            except RuntimeError:
                # openai 3.x's stream raises at the end of an incomplete response
                pass
        types = [e.type for e in events]
        assert types[:4] == ["response.created", "response.in_progress",
                             "response.output_item.added", "response.content_part.added"], types
        assert types[-1] == last, types
        final = events[-1].response
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert deltas == final.output_text, (deltas, final.output_text)
        seq = [e.sequence_number for e in events]
        assert seq == list(range(len(seq))), seq
        plain = client.responses.create(**kw)
        assert plain.output_text == final.output_text
        assert plain.status == final.status


@test
def previous_response_id_continues_the_conversation():
    first = client.responses.create(model=MODEL, input="My name is Ada. Say hi.",
                                    max_output_tokens=10, temperature=0)
    second = client.responses.create(model=MODEL, input="What is my name?",
                                     previous_response_id=first.id, max_output_tokens=10,
                                     temperature=0)
    want = chat_text([{"role": "user", "content": "My name is Ada. Say hi."},
                      {"role": "assistant", "content": first.output_text},
                      {"role": "user", "content": "What is my name?"}], 10)
    assert second.output_text == want, (second.output_text, want)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens
    got = client.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text


WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


@test
def a_required_tool_call_is_a_function_call_item_and_its_output_continues():
    ask = "What is the weather in Paris?"
    r = client.responses.create(model=MODEL, input=ask, tools=[WEATHER], tool_choice="required",
                                parallel_tool_calls=False, max_output_tokens=60, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and r.status == "completed", r.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_"), call
    assert isinstance(json.loads(call.arguments)["city"], str), call.arguments
    assert r.tools[0].name == "get_weather" and r.tool_choice == "required"
    assert r.parallel_tool_calls is False
    # The same as chat's tool calling on the same conversation.
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": ask}], max_tokens=60, temperature=0,
        tools=[{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}],
        tool_choice="required", parallel_tool_calls=False)
    chat_call = chat.choices[0].message.tool_calls[0].function
    assert (chat_call.name, chat_call.arguments) == (call.name, call.arguments)

    # The tool's result, by previous_response_id, and by the whole conversation as input items.
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}
    by_id = client.responses.create(model=MODEL, previous_response_id=r.id, input=[result],
                                    tools=[WEATHER], max_output_tokens=20, temperature=0)
    items = [{"role": "user", "content": ask},
             {"type": "function_call", "call_id": call.call_id, "name": call.name,
              "arguments": call.arguments}, result]
    by_items = client.responses.create(model=MODEL, input=items, tools=[WEATHER],
                                       max_output_tokens=20, temperature=0)
    assert by_id.output_text == by_items.output_text, (by_id.output_text, by_items.output_text)
    assert by_id.usage.input_tokens == by_items.usage.input_tokens


@test
def a_streamed_tool_call_comes_as_argument_deltas():
    kw = dict(model=MODEL, input="What is the weather in Rome?", tools=[WEATHER],
              tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False,
              max_output_tokens=60, temperature=0)
    with client.responses.stream(**kw) as s:
        events = list(s)
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress",
                         "response.output_item.added"], types
    assert events[2].item.type == "function_call", events[2]
    assert types[-1] == "response.completed", types
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == deltas, (deltas, done)
    final = [o for o in events[-1].response.output if o.type == "function_call"]
    plain = [o for o in client.responses.create(**kw).output if o.type == "function_call"]
    assert [(c.name, c.arguments) for c in final] == [(c.name, c.arguments) for c in plain]
    seq = [e.sequence_number for e in events]
    assert seq == list(range(len(seq))), seq


@test
def errors_are_openai_errors():
    for kw, param in [
        (dict(input="hi", previous_response_id="resp_missing"), "previous_response_id"),
        (dict(input=[{"role": "wizard", "content": "hi"}]), "input"),
        (dict(input="hi", tools=[{"type": "web_search"}]), "tools"),
        (dict(input=42), "input"),
    ]:
        try:
            client.responses.create(model=MODEL, max_output_tokens=4, **kw)
        except openai.BadRequestError as e:
            assert e.body["param"] == param, (kw, e.body)
        else:
            raise AssertionError(f"{kw} was accepted")
    try:
        client.responses.retrieve("resp_missing")
    except openai.NotFoundError:
        pass
    else:
        raise AssertionError("an unknown response id was found")


if __name__ == "__main__":
    main()
