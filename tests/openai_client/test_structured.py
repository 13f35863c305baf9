"""Structured outputs and tool calling through the official `openai` Python client against a
running `tokenmill serve` on the default model.

Usage: python test_structured.py BASE_URL MODEL

Every constrained reply must parse and validate (jsonschema) against its schema: a varied
set of schemas, greedy and sampled, alone and at concurrency 16 mixed with free requests
(which must generate exactly what they generate alone). Tool calls: required, named and
parallel_tool_calls=false, streamed and not, and a call -> tool result -> answer round trip.
Runs without pytest (harness.py): one line per test and a closing `N passed, M failed`.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
from openai import OpenAI
from pydantic import BaseModel, Field

from harness import main, test

BASE, MODEL = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=300)


USER = [{"role": "user", "content": "Describe a person from Paris as JSON."}]

SCHEMAS = {
    "nested_object": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                },
                "required": ["city", "zip"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "address"],
        "additionalProperties": False,
    },
    "array_bounds": {
        "type": "object",
        "properties": {
            "hobbies": {
                "type": "array",
                "items": {"type": "string", "maxLength": 16},
                "minItems": 2,
                "maxItems": 4,
            }
        },
        "required": ["hobbies"],
        "additionalProperties": False,
    },
    "enum_and_bounded_numbers": {
        "type": "object",
        "properties": {
            "mood": {"enum": ["happy", "sad", "curious"]},
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "height_m": {"type": "number", "minimum": 1.0, "maximum": 2.5},
        },
        "required": ["mood", "age", "height_m"],
        "additionalProperties": False,
    },
    "string_patterns": {
        "type": "object",
        "properties": {
            "phone": {"type": "string", "pattern": "^\\+33 [0-9]{9}$"},
            "initials": {"type": "string", "pattern": "^[A-Z]\\.[A-Z]\\.$"},
        },
        "required": ["phone", "initials"],
        "additionalProperties": False,
    },
    "any_of": {
        "type": "object",
        "properties": {
            "contact": {
                "anyOf": [
                    {"type": "object", "properties": {"email": {"type": "string", "maxLength": 30}},
                     "required": ["email"], "additionalProperties": False},
                    {"type": "integer", "minimum": 0, "maximum": 1000},
                    {"type": "null"},
                ]
            }
        },
        "required": ["contact"],
        "additionalProperties": False,
    },
    "top_level_array": {
        "type": "array",
        "items": {"type": "boolean"},
        "minItems": 1,
        "maxItems": 5,
    },
}


def json_schema_format(name, schema):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def constrained(schema, name="s", **kw):
    args = dict(model=MODEL, messages=USER, max_tokens=200, temperature=0,
                response_format=json_schema_format(name, schema))
    args.update(kw)
    return client.chat.completions.create(**args)


def check_valid(text, schema):
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


@test
def json_schema_replies_validate_greedy_and_sampled():
    for name, schema in SCHEMAS.items():
        for kw in [{}, {"temperature": 0.9, "seed": 1}, {"temperature": 1.2, "seed": 7}]:
            r = constrained(schema, name, **kw)
            c = r.choices[0]
            assert c.finish_reason == "stop", (name, kw, c.finish_reason, c.message.content)
            check_valid(c.message.content, schema)


@test
def parse_with_a_pydantic_model():
    class Address(BaseModel):
        city: str = Field(max_length=20)
        country: str = Field(max_length=20)

    class Person(BaseModel):
        name: str = Field(max_length=30)
        age: int = Field(ge=0, le=120)
        address: Address

    r = client.chat.completions.parse(model=MODEL, messages=USER, response_format=Person,
                                      max_tokens=200, temperature=0)
    p = r.choices[0].message.parsed
    assert isinstance(p, Person), r
    assert 0 <= p.age <= 120 and isinstance(p.address, Address)


@test
def json_object_choice_regex_and_grammar_spellings():
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=120, temperature=0,
                                       response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    choices = ["Paris", "London", "Rome"]
    for body in [{"guided_choice": choices}, {"structured_outputs": {"choice": choices}}]:
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Capital of France?"}],
            max_tokens=10, temperature=0, extra_body=body)
        assert r.choices[0].message.content in choices, r.choices[0].message.content
    r = client.completions.create(model=MODEL, prompt="Today's date:", max_tokens=20,
                                  temperature=0.7, seed=3,
                                  extra_body={"guided_regex": "20[0-9]{2}-[01][0-9]-[0-3][0-9]"})
    t = r.choices[0].text
    assert len(t) == 10 and t[4] == "-" and t[7] == "-" and t[:2] == "20", t
    r = client.completions.create(
        model=MODEL, prompt="Answer:", max_tokens=20, temperature=0,
        extra_body={"guided_grammar": 'start: "yes" | "no" | "maybe " NUM\nNUM: /[0-9]{1,2}/'})
    t = r.choices[0].text
    assert t in ("yes", "no") or (t.startswith("maybe ") and t[6:].isdigit()), t


@test
def streamed_constrained_reply_is_valid_json():
    schema = SCHEMAS["enum_and_bounded_numbers"]
    text = ""
    for chunk in constrained(schema, stream=True):
        for ch in chunk.choices:
            text += ch.delta.content or ""
    check_valid(text, schema)


def free(prompt):
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0,
                                  extra_body={"ignore_eos": True})
    return r.choices[0].text


@test
def concurrency_16_mixed_batch():
    prompts = [f"Story number {i}: once upon a time" for i in range(8)]
    alone = [free(p) for p in prompts]
    names = list(SCHEMAS)
    jobs = []
    with ThreadPoolExecutor(16) as pool:
        for i in range(8):
            schema = SCHEMAS[names[i % len(names)]]
            jobs.append(("c", schema, pool.submit(constrained, schema, "s", temperature=0.8,
                                                  seed=i)))
            jobs.append(("f", i, pool.submit(free, prompts[i])))
        for kind, what, fut in jobs:
            if kind == "c":
                check_valid(fut.result().choices[0].message.content, what)
            else:
                assert fut.result() == alone[what], (fut.result(), alone[what])


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z]+$"}},
            "required": ["tz"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_calls(calls, allowed):
    assert calls, "no tool calls"
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in allowed}
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_"), c
        assert c.function.name in by_name, c.function.name
        jsonschema.validate(json.loads(c.function.arguments), by_name[c.function.name])


@test
def required_tool_call_and_round_trip():
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME],
                                       tool_choice="required", max_tokens=200, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    check_calls(c.message.tool_calls, [WEATHER, TIME])
    call = c.message.tool_calls[0]
    follow = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "sky": "clear"}'},
    ]
    r = client.chat.completions.create(model=MODEL, messages=follow, tools=[WEATHER, TIME],
                                       tool_choice="none", max_tokens=40, temperature=0)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length") and c.message.content, c
    assert not c.message.tool_calls
    # The same round, streamed: the call as deltas, then the answer as content.
    stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME],
                                            tool_choice="required", parallel_tool_calls=False,
                                            max_tokens=200, temperature=0, stream=True)
    call_id, name, args = None, None, ""
    for chunk in stream:
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                call_id = tc.id or call_id
                name = (tc.function and tc.function.name) or name
                args += (tc.function and tc.function.arguments) or ""
    jsonschema.validate(json.loads(args), {"get_weather": WEATHER, "get_time": TIME}[name]["function"]["parameters"])
    follow = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]},
        {"role": "tool", "tool_call_id": call_id, "content": '{"result": "sunny"}'},
    ]
    answer = "".join(
        ch.delta.content or ""
        for chunk in client.chat.completions.create(model=MODEL, messages=follow, max_tokens=40,
                                                    temperature=0, stream=True, tools=[WEATHER])
        for ch in chunk.choices)
    assert answer, "no streamed answer"


@test
def named_tool_choice_without_parallel_calls():
    named = {"type": "function", "function": {"name": "get_time"}}
    for seed in range(3):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME],
                                           tool_choice=named, parallel_tool_calls=False,
                                           max_tokens=200, temperature=1.0, seed=seed)
        calls = r.choices[0].message.tool_calls
        assert len(calls) == 1 and calls[0].function.name == "get_time", calls
        check_calls(calls, [TIME])


@test
def streamed_tool_calls_arrive_as_argument_deltas():
    stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                            tool_choice="required", max_tokens=200,
                                            temperature=0, stream=True)
    calls, finish, arg_deltas = {}, None, 0
    for chunk in stream:
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                if tc.id:
                    slot["id"] = tc.id
                if tc.function and tc.function.name:
                    slot["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    slot["arguments"] += tc.function.arguments
                    arg_deltas += 1
            finish = ch.finish_reason or finish
    assert finish == "tool_calls", finish
    assert calls and arg_deltas > 1, (calls, arg_deltas)
    for slot in calls.values():
        assert slot["id"].startswith("call_") and slot["name"] == "get_weather", slot
        jsonschema.validate(json.loads(slot["arguments"]), WEATHER["function"]["parameters"])
    # The same call, not streamed.
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                       tool_choice="required", max_tokens=200, temperature=0)
    whole = r.choices[0].message.tool_calls[0].function.arguments
    assert json.loads(whole) == json.loads(calls[0]["arguments"]), (whole, calls)


@test
def bad_schemas_and_tools_are_400s_naming_the_field():
    cases = [
        (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}),
         "response_format"),
        (dict(extra_body={"guided_regex": "(unclosed"}), "guided_regex"),
        (dict(extra_body={"guided_grammar": "start: missing_rule"}), "guided_grammar"),
        (dict(response_format=json_schema_format("deep", json.loads(
            '{"type":"object","properties":{"a":' * 40 + '{"type":"string"}' + "}}" * 40))),
         "response_format"),
        (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
         "tool_choice"),
        (dict(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}),
         "tool_choice"),
    ]
    for kw, param in cases:
        try:
            client.chat.completions.create(model=MODEL, messages=USER, max_tokens=5, **kw)
        except openai.BadRequestError as e:
            assert e.status_code == 400, e
            assert e.body.get("param") == param, (param, e.body)
        else:
            raise AssertionError(f"no error for {param}")


if __name__ == "__main__":
    main()
