"""Checks `ternion serve --api-key KEY` with the official `openai` Python package.

Usage: python3 openai_auth.py BASE_URL MODEL_ID KEY
Exits non-zero on the first failed check; prints "openai auth: all checks passed" last.
"""

import sys

import openai
from openai import OpenAI


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def refused(client, what):
    try:
        client.models.list()
    except openai.AuthenticationError as e:
        check(e.status_code == 401, f"{what}: status {e.status_code}")
        body = e.body if isinstance(e.body, dict) else {}
        check(body.get("code") == "invalid_api_key", f"{what}: error body {e.body}")
        return
    raise AssertionError(f"{what}: the request was not refused")


def main():
    base, model, key = sys.argv[1], sys.argv[2], sys.argv[3]

    def client(api_key):
        return OpenAI(base_url=base + "/v1", api_key=api_key, max_retries=0, timeout=60)

    refused(client("not-the-key"), "a wrong key")
    refused(client(key + "x"), "the key with one more character")
    good = client(key)
    models = good.models.list().data
    check([m.id for m in models] == [model], f"models: {models}")
    r = good.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=4,
        temperature=0,
    )
    check(r.usage.completion_tokens <= 4, f"usage: {r.usage}")
    print("openai auth: all checks passed")


if __name__ == "__main__":
    main()
