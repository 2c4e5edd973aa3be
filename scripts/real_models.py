#!/usr/bin/env python3
"""Writes a golden manifest (golden2's schema, see ../shared/golden2/README.md) for real
GGUF files, with llama.cpp as the oracle, so that `ternion validate` can compare them.

    python3 scripts/real_models.py --oracle ORACLE --quantize LLAMA_QUANTIZE --out DIR \
        [--derive SRC.gguf:TYPE ...] MODEL.gguf[:chatml|gemma] ...

ORACLE is a small program against llama.cpp's `include/llama.h` (not part of this
repository; docs/VALIDATION.md gives its contract): `ORACLE MODEL PROMPT_FILE N_GEN KV
THREADS [IDS_FILE]` prints JSON with the prompt's `tokens` (tokenized with the vocabulary's
add_bos and parse_special = true), `prompt_top20` (ids and logits at every prompt position
of one batch), `greedy_ids` and `greedy_top5` (N_GEN one-token greedy steps, first index
wins ties) and, given IDS_FILE (one line of ids per prompt position), `at_ids`, the logits
at those ids. Runs use flash attention off and an F32 KV cache, like golden2's oracle.

For every model, run A is the file as it is and run B the same weights dequantized to F32
by `llama-quantize --allow-requantize --pure MODEL OUT F32`; a case's
`top20_max_abs_diff_A_vs_B` is max |A - B| over A's top-20 ids at every prompt position,
llama.cpp's own noise, of which `ternion validate` allows twice. With `--with-f32` the
F32 files are cases of their own (run B is then run A): Ternion on the same F32 weights,
where only float rounding differs, is held to `tolerance` = F32_TOL. `--derive SRC:TYPE`
first writes SRC requantized to TYPE (from its F32 dequantization; llama-quantize's own
type mix for TYPE) and adds it to the models. Nothing is downloaded.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

N_GEN = 32
# Max |ours - llama.cpp| over the top-20 for F32 weights (no activation quantization on
# either side): float32 rounding and summation order only.
F32_TOL = 0.05

PLAIN = [
    ("p0_en_fox", "The quick brown fox jumps over the lazy dog."),
    (
        "p1_code",
        "def fibonacci(n):\n    if n < 2:\n        return n\n"
        "    return fibonacci(n - 1) + fibonacci(n - 2)\n\n# 12345 + 678 = 13023\n",
    ),
    ("p2_multi", "Ça coûte 12,50 € — 東京は日本の首都です。 Привет, мир! \t tabs   and  spaces"),
]

CHAT = {
    "chatml": "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France? Answer in one "
    "sentence.<|im_end|>\n<|im_start|>assistant\n",
    "gemma": "<start_of_turn>user\nWhat is the capital of France? Answer in one sentence."
    "<end_of_turn>\n<start_of_turn>model\n",
}

TOPICS = [
    "rivers carry sediment from the mountains to the sea",
    "bees return to the hive and dance to show where the flowers are",
    "the printing press made books cheaper and spread literacy across Europe",
    "a compiler turns source code into machine instructions in several passes",
    "tides rise and fall twice a day because of the moon's gravity",
    "bread rises when yeast ferments sugar and releases carbon dioxide",
    "glaciers carve wide U-shaped valleys as they slowly move downhill",
    "the violin has four strings tuned in perfect fifths",
]


def long_prompt():
    """About 700 tokens of varied English: longer than a 512-token sliding window and than
    one 512-token prefill chunk."""
    parts = []
    for i in range(48):
        t = TOPICS[i % len(TOPICS)]
        parts.append(f"Note {i + 1}: as every student learns in year {1900 + 7 * i}, {t}.")
    return " ".join(parts)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def quantize(tool, src, dst, ty):
    if not os.path.exists(dst):
        args = [tool, "--allow-requantize"] + (["--pure"] if ty == "F32" else [])
        subprocess.run(args + [src, dst, ty], check=True, capture_output=True)
    return dst


def oracle(tool, model, prompt_file, threads, ids_file=None):
    args = [tool, model, prompt_file, str(N_GEN), "f32", str(threads)]
    out = subprocess.run(args + ([ids_file] if ids_file else []), check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--oracle", required=True)
    ap.add_argument("--quantize", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--derive", action="append", default=[], metavar="SRC:TYPE")
    ap.add_argument("--with-f32", action="store_true",
                    help="also cases of each given (not derived) model's F32 dequantization")
    ap.add_argument("models", nargs="+", metavar="MODEL[:chatml|gemma]")
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    for d in ("cases", "f32", "prompts", "derived"):
        os.makedirs(os.path.join(out, d), exist_ok=True)

    models = []
    for spec in a.models:
        path, _, chat = spec.partition(":")
        if chat and chat not in CHAT:
            sys.exit(f"{spec}: chat style must be one of {', '.join(CHAT)}")
        models.append((os.path.abspath(path), chat, None, False))
    for spec in a.derive:
        src, _, ty = spec.rpartition(":")
        src = os.path.abspath(src)
        chat = next((c for p, c, _, _ in models if p == src), "")
        stem = os.path.splitext(os.path.basename(src))[0]
        f32 = quantize(a.quantize, src, os.path.join(out, "f32", stem + ".f32.gguf"), "F32")
        dst = os.path.join(out, "derived", f"{stem}.requant-{ty}.gguf")
        models.append((quantize(a.quantize, f32, dst, ty), chat, os.path.basename(src), True))

    prompts = list(PLAIN) + [("p4_long", long_prompt())]
    manifest = {"set": "real", "format_version": 1, "prompts": [], "models": [], "cases": []}
    manifest["oracle"] = {
        "tool": "ORACLE program against llama.cpp's include/llama.h (docs/VALIDATION.md)",
        "n_gen": N_GEN, "kv_cache_type": "f32", "flash_attn": False, "threads": a.threads,
    }
    if a.with_f32:
        models += [(os.path.join(out, "f32", os.path.splitext(os.path.basename(p))[0]
                                 + ".f32.gguf"), c, os.path.basename(p), False)
                   for p, c, d, _ in models if d is None]
    for path, chat, derived_from, requantized in models:
        stem = os.path.splitext(os.path.basename(path))[0]
        b_model = path
        if not stem.endswith(".f32"):
            b_model = quantize(a.quantize, path, os.path.join(out, "f32", stem + ".f32.gguf"),
                               "F32")
        manifest["models"].append({"file": path, "sha256": sha256(path),
                                   "size": os.path.getsize(path),
                                   "derived_from": derived_from})
        # A derived file tests its formats; the long prompt (the architecture's sliding
        # window and chunked prefill) runs on the files as published.
        mine = [p for p in prompts if not (requantized and p[0] == "p4_long")]
        mine += [("p3_chat_" + chat, CHAT[chat])] if chat else []
        for pid, text in mine:
            pfile = os.path.join(out, "prompts", pid + ".txt")
            with open(pfile, "w", encoding="utf-8") as f:
                f.write(text)
            run_a = oracle(a.oracle, path, pfile, a.threads)
            ids_file = os.path.join(out, "prompts", pid + ".ids")
            with open(ids_file, "w") as f:
                f.writelines(" ".join(map(str, r)) + "\n" for r in run_a["prompt_top20"]["ids"])
            run_b = oracle(a.oracle, b_model, pfile, a.threads, ids_file)
            a_vs_b = max(abs(x - y) for ra, rb in zip(run_a["prompt_top20"]["logits"],
                                                      run_b["at_ids"]["logits"])
                         for x, y in zip(ra, rb))
            case_file = f"cases/{stem}__{pid}.json"
            body = {"tokens": run_a["tokens"],
                    "model_run": {k: run_a[k] for k in
                                  ("prompt_top20", "greedy_ids", "greedy_top5")},
                    "ref_dequant_f32": {k: run_b[k] for k in
                                        ("prompt_top20", "greedy_ids", "greedy_top5")}}
            with open(os.path.join(out, case_file), "w") as f:
                json.dump(body, f)
            extra = {"tolerance": F32_TOL} if b_model == path else {}
            manifest["cases"].append({**extra,
                "model": path, "prompt_id": pid, "prompt_text": text,
                "add_bos": run_a["add_bos"], "bos_id": run_a["bos_id"], "parse_special": True,
                "tokens": run_a["tokens"], "n_tokens": len(run_a["tokens"]),
                "n_vocab": run_a["n_vocab"], "greedy_ids": run_a["greedy_ids"],
                "top20_max_abs_diff_A_vs_B": a_vs_b, "topk_file": case_file,
            })
            print(f"{stem} {pid}: {len(run_a['tokens'])} tokens, A vs B {a_vs_b:.4f}",
                  flush=True)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
