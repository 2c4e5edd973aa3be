"""Structured output and tool calls of `ternion serve` through the official `openai`
Python package, on a random-weight model (the point of constraining: its own choices are
noise).

Usage: python3 openai_structured.py BASE_URL MODEL_ID
Exits non-zero on the first failed check; prints "openai structured: all checks passed" last.
"""

import json
import sys

from openai import OpenAI


def check(cond, what):
    if not cond:
        raise AssertionError(what)


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "role": {"enum": ["admin", "user", "guest"]},
        "scores": {"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 99},
                   "maxItems": 3},
    },
    "required": ["name", "age", "role", "scores"],
    "additionalProperties": False,
}


def valid_person(v):
    check(isinstance(v, dict) and list(v) == ["name", "age", "role", "scores"], f"keys: {v}")
    check(isinstance(v["name"], str) and len(v["name"]) <= 12, f"name: {v}")
    check(isinstance(v["age"], int) and 0 <= v["age"] <= 130, f"age: {v}")
    check(v["role"] in ("admin", "user", "guest"), f"role: {v}")
    check(len(v["scores"]) <= 3, f"scores: {v}")
    check(all(isinstance(x, int) and -9 <= x <= 99 for x in v["scores"]), f"scores: {v}")


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "unit": {"enum": ["C", "F"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


def main():
    base, model = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
    ask = [{"role": "user", "content": "Describe a user as JSON."}]

    for seed in range(3):
        r = client.chat.completions.create(
            model=model, messages=ask, max_tokens=300, temperature=1.0, seed=seed,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
        )
        c = r.choices[0]
        check(c.finish_reason == "stop", f"finish: {c.finish_reason} {c.message.content!r}")
        valid_person(json.loads(c.message.content))

    stream = client.chat.completions.create(
        model=model, messages=ask, max_tokens=300, temperature=0, stream=True,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    valid_person(json.loads(text))

    # Any JSON object: a random model's strings run on, but the answer closes within
    # max_tokens (finish "length" when it had to be shortened) and always parses.
    for seed in range(4):
        r = client.chat.completions.create(
            model=model, messages=ask, max_tokens=60, temperature=1.0, seed=seed,
            response_format={"type": "json_object"},
        )
        c = r.choices[0]
        check(c.finish_reason in ("stop", "length"), f"json_object: {c.finish_reason}")
        check(isinstance(json.loads(c.message.content), dict), c.message.content)

    r = client.completions.create(
        model=model, prompt="Code:", max_tokens=20, temperature=1.0, seed=3,
        extra_body={"regex": "[A-Z]{2}-[0-9]{3}"},
    )
    t = r.choices[0].text
    check(len(t) == 6 and t[:2].isupper() and t[2] == "-" and t[3:].isdigit(), f"regex: {t!r}")

    # Tool call round trip: a forced call, its result sent back, an answer.
    ask_weather = [{"role": "user", "content": "What is the weather in Oslo?"}]
    r = client.chat.completions.create(
        model=model, messages=ask_weather, tools=[WEATHER], tool_choice="required",
        max_tokens=100, temperature=0,
    )
    c = r.choices[0]
    check(c.finish_reason == "tool_calls", f"finish: {c.finish_reason}")
    check(c.message.content is None, f"content: {c.message.content!r}")
    call = c.message.tool_calls[0]
    check(call.type == "function" and call.function.name == "get_weather", f"call: {call}")
    args = json.loads(call.function.arguments)
    check(set(args) == {"city", "unit"} and args["unit"] in ("C", "F"), f"arguments: {args}")
    follow = ask_weather + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 3})},
    ]
    r = client.chat.completions.create(
        model=model, messages=follow, tools=[WEATHER], tool_choice="none", max_tokens=8,
        temperature=0,
    )
    check(r.choices[0].message.content is not None, f"answer: {r.choices[0]}")
    check(r.choices[0].message.tool_calls is None, f"answer: {r.choices[0]}")

    # A named call, streamed: the client sees the call in the deltas.
    stream = client.chat.completions.create(
        model=model, messages=ask_weather, tools=[WEATHER], max_tokens=100, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True,
    )
    calls, finish = [], None
    for ch in stream:
        if not ch.choices:
            continue
        calls += ch.choices[0].delta.tool_calls or []
        finish = ch.choices[0].finish_reason or finish
    check(finish == "tool_calls" and len(calls) == 1, f"streamed: {finish} {calls}")
    check(calls[0].function.name == "get_weather", f"streamed call: {calls[0]}")
    check(set(json.loads(calls[0].function.arguments)) == {"city", "unit"}, f"{calls[0]}")

    # Chat log-probabilities: greedy picks the best alternative, best first.
    r = client.chat.completions.create(
        model=model, messages=ask, max_tokens=6, temperature=0, logprobs=True, top_logprobs=4,
    )
    content = r.choices[0].logprobs.content
    check(len(content) == r.usage.completion_tokens, f"one entry per token: {content}")
    for e in content:
        tops = [t.logprob for t in e.top_logprobs]
        check(len(tops) == 4 and tops == sorted(tops, reverse=True), f"top: {e}")
        check(e.token == e.top_logprobs[0].token and e.logprob == tops[0], f"greedy: {e}")
        check(sum(2.718281828 ** t for t in tops) <= 1.0001, f"mass: {tops}")
    check("".join(e.token for e in content) == r.choices[0].message.content, "tokens = text")
    # n = 2: two schema-valid choices, seeded one apart, whole and streamed.
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    r = client.chat.completions.create(
        model=model, messages=ask, max_tokens=300, temperature=1.0, seed=5, n=2,
        response_format=fmt,
    )
    check([c.index for c in r.choices] == [0, 1], f"choices: {r.choices}")
    for c in r.choices:
        valid_person(json.loads(c.message.content))
    check(r.choices[0].message.content != r.choices[1].message.content, "two different draws")
    texts = ["", ""]
    for ch in client.chat.completions.create(
        model=model, messages=ask, max_tokens=300, temperature=1.0, seed=5, n=2,
        response_format=fmt, stream=True,
    ):
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
    check(texts == [c.message.content for c in r.choices], f"streamed n=2: {texts}")
    print("openai structured: all checks passed")


if __name__ == "__main__":
    main()
