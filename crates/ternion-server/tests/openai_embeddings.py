"""Calls `POST /v1/embeddings` of a running `ternion serve` with the official `openai`
Python package and prints what came back as JSON, for the Rust test to compare.

Usage: python3 openai_embeddings.py BASE_URL MODEL_ID
  BASE_URL like http://127.0.0.1:8080 (without /v1).
Prints {"default": [...], "float": [...], "tokens": [...], "usage": [prompt, total]}:
the vectors of the inputs "hello world" and "a second input" with the client's default
encoding (base64, decoded by the client) and with encoding_format="float", and of the
token ids [1, 2, 3].
"""

import json
import sys

from openai import OpenAI


def main():
    base, model = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=base + "/v1", api_key="not-needed", max_retries=0, timeout=60)
    texts = ["hello world", "a second input"]
    default = client.embeddings.create(model=model, input=texts)
    floats = client.embeddings.create(model=model, input=texts, encoding_format="float")
    tokens = client.embeddings.create(model=model, input=[1, 2, 3])
    for r in (default, floats, tokens):
        assert r.object == "list", r.object
        assert [d.index for d in r.data] == list(range(len(r.data))), r.data
        assert all(d.object == "embedding" for d in r.data)
    print(
        json.dumps(
            {
                "default": [d.embedding for d in default.data],
                "float": [d.embedding for d in floats.data],
                "tokens": [d.embedding for d in tokens.data],
                "usage": [default.usage.prompt_tokens, default.usage.total_tokens],
            }
        )
    )


if __name__ == "__main__":
    main()
