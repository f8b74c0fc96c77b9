"""A thinking model's reasoning split from its answer (reasoning_content), through the OpenAI SDK, on the qwen3-tiny
fixture (Qwen3's chat template, which thinks in <think>…</think>). Its random weights are steered by a regular
expression (structured_outputs, on a server whose constraints hold for the reasoning too:
engine.structured_output_in_reasoning) into an answer that thinks first, so the split is checked on the model's own
tokens, whole and streamed; SGLang's separate_reasoning and stream_reasoning and vLLM's include_reasoning change it
as they do there. By default a constraint holds for the answer only: the model may open its reasoning and think
freely, or answer at once within the constraint."""

import json
import os
import re

import pytest

from conftest import MODELS, Server, openai_client

THINKING = r"<think>\nadd two and two\n</think>\n\nIt is 4\."
ASK = [{"role": "user", "content": "2+2?"}]


@pytest.fixture(scope="module")
def sdk():
    s = Server(model="qwen3-tiny", http=True, engine={"backend": "cpu", "block_size": 16, "cpu_kv_cache_gib": 0.25,
                                                      "structured_output_in_reasoning": True})
    yield openai_client(s, timeout=120)
    assert s.stop() == 0, s.logs()


def test_by_default_the_constraint_holds_for_the_answer_after_any_reasoning():
    s = Server(model="qwen3-tiny", http=True, engine={"backend": "cpu", "block_size": 16, "cpu_kv_cache_gib": 0.25})
    try:
        client, model = openai_client(s, timeout=120)
        # The regex the suite above steers the whole output with: here the answer must match it, so the model's
        # first tokens either open a free reasoning or begin the answer's own "<think>" text.
        steer = client.chat.completions.create(model=model, messages=ASK, max_tokens=24, temperature=0,
                                               extra_body={"structured_outputs": {"regex": THINKING}})
        assert steer.choices[0].finish_reason in ("stop", "length")
        # The tokens with "<" refused by a logit bias: no reasoning can open, and the answer is the constraint's
        # from the first token.
        with open(os.path.join(MODELS, "qwen3-tiny", "tokenizer.json")) as f:
            vocab = json.load(f)["model"]["vocab"]
        opening = {str(i): -100 for t, i in vocab.items() if t in ("<", "\u0120<")}
        assert len(opening) == 2
        m = client.chat.completions.create(model=model, messages=ASK, max_tokens=24, temperature=0,
                                           logit_bias=opening,
                                           extra_body={"structured_outputs": {"regex": "[a-f]{3}-[0-9]{2}"}})
        c = m.choices[0]
        assert c.finish_reason == "stop", c
        assert re.fullmatch(r"[a-f]{3}-[0-9]{2}", c.message.content), c.message.content
        assert not c.message.model_extra.get("reasoning_content")
    finally:
        assert s.stop() == 0, s.logs()


def ask(sdk, **extra):
    client, model = sdk
    body = {"structured_outputs": {"regex": THINKING}, **extra.pop("extra_body", {})}
    return client.chat.completions.create(model=model, messages=ASK, max_tokens=64, extra_body=body, **extra)


def test_the_reasoning_comes_apart_from_the_answer(sdk):
    m = ask(sdk).choices[0].message
    assert m.content == "It is 4."
    assert m.model_extra["reasoning_content"] == "add two and two\n"


def test_streamed_reasoning_arrives_before_the_answer(sdk):
    reasoning, content, order = "", "", []
    for chunk in ask(sdk, stream=True):
        d = chunk.choices[0].delta
        if d.model_extra.get("reasoning_content"):
            reasoning += d.model_extra["reasoning_content"]
            order.append("r")
        if d.content:
            content += d.content
            order.append("c")
    assert reasoning == "add two and two\n" and content == "It is 4."
    assert order == sorted(order, reverse=True), order  # every reasoning piece before the first answer piece


def test_the_switches(sdk):
    whole = ask(sdk, extra_body={"separate_reasoning": False}).choices[0].message
    assert whole.content.startswith("<think>") and whole.content.endswith("It is 4.")
    assert "reasoning_content" not in whole.model_extra
    dropped = ask(sdk, extra_body={"include_reasoning": False}).choices[0].message
    assert dropped.content == "It is 4." and "reasoning_content" not in dropped.model_extra
    chunks = list(ask(sdk, stream=True, extra_body={"stream_reasoning": False}))
    with_reasoning = [i for i, c in enumerate(chunks) if c.choices and c.choices[0].delta.model_extra.get(
        "reasoning_content")]
    assert len(with_reasoning) == 1 and chunks[with_reasoning[0]].choices[0].finish_reason is not None
