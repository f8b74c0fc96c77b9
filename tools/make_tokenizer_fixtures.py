#!/usr/bin/env python3
"""Records Hugging Face `tokenizers` ids and decodes of hard strings for every test model's tokenizer.

    .venv/bin/python tools/make_tokenizer_fixtures.py tests/fixtures/models tests/fixtures/tokenizer
"""
import json
import os
import sys

from tokenizers import Tokenizer

HARD_STRINGS = [
    "", " ", "  ", "\n", "\t\t", "Hello world", " Hello world", "Hello  world", "Hello   world  ",
    "hello\n\nworld\n", "  leading and trailing  ", "line one\r\nline two\r\n", "tabs\tand\tspaces \t \n",
    "I'm here, you're there, they'll go; we've done it. DON'T SHOUT. She'd've", "it's 's 't",
    "1234567890 12 123 1234 3.14159 -42 1e10 0x1F", "2024-11-22T10:30:00Z",
    "def forward(self, x):\n    return self.norm(x)  # comment\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "Ünïcödé façade naïve café", "e\u0301 versus \u00e9", "Ａｂｃ fullwidth", "日本語のテキストです。", "中文文本，北京是中国的首都。",
    "한국어 텍스트", "Привет, мир!", "مرحبا بالعالم", "emoji 😀 🚀 👍🏽 ❤️ 👨‍👩‍👧‍👦", "🤖🤖🤖", "zero\u200bwidth",
    "<s> literal", "</s>", "<|im_start|>user\nhi<|im_end|>\n", "<|begin_of_text|>Hi<|eot_id|>", "<unk>",
    "<0x41> not a byte", "▁ already metaspace ▁▁", "!!!???...,,,", "a" * 50, "ab " * 20,
    "The scheduler batches tokens every step.", "don't can't won't", "\u00a0non-breaking\u00a0space",
    "mixed 日本 and English 123 😀!", "\x00\x01control\x7f", "\U0001F600\U0001F601", "ok\n\n\n\n",
]


# Runs of byte-fallback tokens (SentencePiece-style tokenizers) and how ByteFallback decodes them: a run that is
# valid UTF-8 as a whole is its text, any other run one U+FFFD per byte token.
BYTE_RUNS = [[0x1C, 0x83], [0xE6, 0x97, 0xA5], [0xE6, 0x97, 0xA5, 0xE6], [0xE6, 0x97], [0x41, 0xFF, 0x42], [0xF0],
             [0xF0, 0x9F, 0x98, 0x80, 0x80], [0xC3, 0xA9, 0x0A]]


def byte_runs(tok):
    vocab = tok.get_vocab()
    if "<0x1C>" not in vocab:
        return []
    word = tok.encode("hello", add_special_tokens=False).ids
    out = []
    for run in BYTE_RUNS:
        ids = [vocab[f"<0x{b:02X}>"] for b in run]
        for seq in (ids, word + ids, ids + word + ids[:1], ids + ids):
            out.append({"ids": seq, "decoded": tok.decode(seq, skip_special_tokens=True)})
    return out


def main():
    models_dir, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    for name in sorted(os.listdir(models_dir)):
        path = os.path.join(models_dir, name, "tokenizer.json")
        if not os.path.exists(path) or name.endswith("-fp8"):  # FP8 checkpoints share their source's tokenizer
            continue
        tok = Tokenizer.from_file(path)
        cases = []
        for text in HARD_STRINGS:
            ids = tok.encode(text, add_special_tokens=True).ids
            cases.append({
                "text": text,
                "ids": ids,
                "ids_no_special": tok.encode(text, add_special_tokens=False).ids,
                "decoded": tok.decode(ids, skip_special_tokens=True),
                "decoded_with_special": tok.decode(ids, skip_special_tokens=False),
            })
        spec = {"model": name, "command": "tools/make_tokenizer_fixtures.py", "cases": cases}
        runs = byte_runs(tok)
        if runs:
            spec["byte_runs"] = runs
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            json.dump(spec, f, indent=1, ensure_ascii=False)
        print(name, len(cases), "cases")


if __name__ == "__main__":
    main()
