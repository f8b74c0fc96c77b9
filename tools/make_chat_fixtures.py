#!/usr/bin/env python3
"""Records what Hugging Face transformers' apply_chat_template renders for every test model's template, the
bundled SmolLM2's (from its GGUF) and the feature templates of tools/chat_templates.py.

Needs transformers, jinja2 and gguf (no torch):

    python3 tools/make_chat_fixtures.py tests/fixtures/chat/renders.json
"""
import json
import os
import sys

import gguf
import jinja2
import transformers
from transformers import PreTrainedTokenizerFast

sys.path.insert(0, os.path.dirname(__file__))
from chat_templates import FEATURE_TEMPLATES, MODEL_TEMPLATES  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SMOLLM2 = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

S, U, A = "system", "user", "assistant"
CONVERSATIONS = [
    [(U, "What is the capital of France?")],
    [(S, "You are terse."), (U, "Hi there?")],
    [(U, "  Hi, padded  \n"), (A, " Hello! How can I help? "), (U, "Tell me about 日本語 ✓ and x = {'a': 1}\n")],
    [(S, "Sys\nwith lines"), (U, "one"), (A, "two"), (U, "three"), (A, "four"), (U, "x")],
    [(U, "first"), (U, "second in a row")],
    [(A, "assistant first")],
    [(U, "call a tool"), (A, "calling"), ("tool", "result one"), ("tool", "result two"), (U, "thanks")],
    [(U, "")],
]


def render(tok, conversation, add_generation_prompt):
    messages = [{"role": r, "content": c} for r, c in conversation]
    try:
        return {"rendered": tok.apply_chat_template(messages, tokenize=False,
                                                    add_generation_prompt=add_generation_prompt)}
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e)}


def main():
    out_path = sys.argv[1]
    base = os.path.join(ROOT, "tests", "fixtures", "models", "qwen2-tiny", "tokenizer.json")
    templates = []
    for name, template in MODEL_TEMPLATES.items():
        cfg = json.load(open(os.path.join(ROOT, "tests", "fixtures", "models", name, "tokenizer_config.json")))
        assert cfg["chat_template"] == template, f"{name}: regenerate the model (tools/make_test_models.py)"
        templates.append({"name": name, "model": f"tests/fixtures/models/{name}", "template": template,
                          "bos_token": cfg.get("bos_token", ""), "eos_token": cfg.get("eos_token", "")})
    reader = gguf.GGUFReader(SMOLLM2)
    field = reader.fields["tokenizer.chat_template"]
    tokens = reader.fields["tokenizer.ggml.tokens"]
    eos = tokens.parts[tokens.data[int(reader.fields["tokenizer.ggml.eos_token_id"].parts[-1][0])]].tobytes().decode()
    templates.append({"name": "smollm2", "model": "models/SmolLM2-135M-Instruct.Q4_1.gguf",
                      "template": field.parts[field.data[0]].tobytes().decode(), "bos_token": "",
                      "eos_token": eos})
    for name, template in FEATURE_TEMPLATES.items():
        templates.append({"name": name, "model": "", "template": template, "bos_token": "<BOS>",
                          "eos_token": "<EOS>"})
    for t in templates:
        tok = PreTrainedTokenizerFast(tokenizer_file=base, chat_template=t["template"],
                                      bos_token=t["bos_token"] or None, eos_token=t["eos_token"] or None)
        t["cases"] = []
        for conversation in CONVERSATIONS:
            for agp in (True, False):
                case = {"messages": [{"role": r, "content": c} for r, c in conversation],
                        "add_generation_prompt": agp}
                case.update(render(tok, conversation, agp))
                t["cases"].append(case)
        errors = sum("error" in c for c in t["cases"])
        print(f"{t['name']}: {len(t['cases'])} cases, {errors} refused")
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as f:
        json.dump({"transformers": transformers.__version__, "jinja2": jinja2.__version__,
                   "command": "python3 tools/make_chat_fixtures.py tests/fixtures/chat/renders.json",
                   "templates": templates}, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
