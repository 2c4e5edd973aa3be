"""Drives a running `ternion serve` with the official `openai` Python package.

Usage: python3 openai_client.py BASE_URL MODEL_ID
  BASE_URL like http://127.0.0.1:8080 (without /v1); MODEL_ID the served model's id.
Exits non-zero on the first failed check; prints "openai client: all checks passed" last.
"""

import sys

import openai
from openai import OpenAI


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    base, model = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=base + "/v1", api_key="not-needed", max_retries=0, timeout=60)

    ids = [m.id for m in client.models.list().data]
    check(model in ids, f"models.list() has {model}: {ids}")

    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hello."},
    ]

    # Chat, whole.
    r = client.chat.completions.create(
        model=model, messages=messages, max_tokens=12, temperature=0
    )
    check(r.object == "chat.completion", f"object: {r.object}")
    check(r.id.startswith("chatcmpl-"), f"id: {r.id}")
    check(len(r.choices) == 1, "one choice")
    c = r.choices[0]
    check(c.index == 0 and c.message.role == "assistant", f"choice: {c}")
    check(isinstance(c.message.content, str), "content is text")
    check(c.finish_reason in ("stop", "length"), f"finish_reason: {c.finish_reason}")
    u = r.usage
    check(u.prompt_tokens > 0 and u.completion_tokens <= 12, f"usage: {u}")
    check(u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage sum: {u}")
    whole = c.message.content

    # Chat, streamed, with usage.
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, finish, usage, roles = [], None, None, []
    for chunk in stream:
        check(chunk.object == "chat.completion.chunk", f"chunk object: {chunk.object}")
        if chunk.usage is not None:
            check(chunk.choices == [], "the usage chunk has no choices")
            usage = chunk.usage
            continue
        d = chunk.choices[0].delta
        if d.role:
            roles.append(d.role)
        if d.content:
            parts.append(d.content)
        if chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    check(roles == ["assistant"], f"role sent once: {roles}")
    check("".join(parts) == whole, f"streamed {''.join(parts)!r} != whole {whole!r}")
    check(finish == c.finish_reason, f"stream finish {finish} != {c.finish_reason}")
    check(usage is not None and usage.completion_tokens == u.completion_tokens, f"usage {usage}")

    # Completions, whole and streamed.
    r = client.completions.create(model=model, prompt="The sky is", max_tokens=10, temperature=0)
    check(r.object == "text_completion", f"object: {r.object}")
    check(r.choices[0].finish_reason in ("stop", "length"), "finish_reason")
    text = r.choices[0].text
    streamed = "".join(
        ch.choices[0].text
        for ch in client.completions.create(
            model=model, prompt="The sky is", max_tokens=10, temperature=0, stream=True
        )
    )
    check(streamed == text, f"streamed completion {streamed!r} != {text!r}")

    # Sampling with a seed is reproducible.
    a, b = (
        client.completions.create(
            model=model, prompt="Once", max_tokens=8, temperature=0.9, seed=7
        ).choices[0].text
        for _ in range(2)
    )
    check(a == b, f"same seed, different text: {a!r} vs {b!r}")

    # Errors come back as the client's exception types.
    try:
        client.chat.completions.create(model=model, messages=messages, n=9)
        check(False, "n=9 accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400, f"n=9 status {e.status_code}")
    try:
        client.chat.completions.create(model="no-such-model", messages=messages)
        check(False, "unknown model accepted")
    except openai.NotFoundError as e:
        check(e.status_code == 404, f"unknown model status {e.status_code}")

    print("openai client: all checks passed")


if __name__ == "__main__":
    main()
