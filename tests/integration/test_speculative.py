"""Speculative decoding served: the bundled SmolLM2 with prompt-lookup drafts (`speculative.method: ngram`), driven by
the official `openai` SDK. A request that quotes its prompt gets the answer it gets without speculation (the same
request with `speculative: false`), greedy and seeded, whole and streamed, with logprobs and stop strings; the drafts
show in /metrics under inferd's and vLLM's names."""
import os
import urllib.request

import pytest

from conftest import SMOLLM2, SMOLLM2_BACKEND, Server, free_port, openai_client

TEXT = ("The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
        "How vexingly quick daft zebras jump! The five boxing wizards jump quickly.")
QUOTE = [{"role": "user", "content": f"Repeat this text exactly, word for word:\n\n{TEXT}"}]


@pytest.fixture(scope="module")
def served():
    assert os.path.exists(SMOLLM2), "bash scripts/setup.sh fetches the bundled model"
    metrics = free_port()
    s = Server(model=SMOLLM2, http=True,
               engine={"backend": SMOLLM2_BACKEND, "block_size": 16, "cpu_kv_cache_gib": 0.25,
                       "gpu_memory_utilization": 0.2},
               server={"metrics_listen": f"127.0.0.1:{metrics}"},
               # Every step drafts (adaptive off), so that the counters below do not depend on the cpu's timings.
               speculative={"method": "ngram", "max_tokens": 5, "ngram_min": 2, "ngram_max": 4, "adaptive": "false"})
    client, model = openai_client(s, timeout=None)  # no wall-clock limit: busy CI cores are slow, not wrong
    yield s, client, model, metrics
    assert s.stop() == 0, s.logs()


def counter(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not exported")


def test_a_quoting_answer_equals_the_one_without_speculation_and_drafts_are_kept(served):
    s, client, model, metrics = served
    before = counter(metrics, "inferd_spec_decode_accepted_tokens_total")
    spec = client.chat.completions.create(model=model, messages=QUOTE, max_tokens=48, temperature=0, logprobs=True,
                                          top_logprobs=2)
    accepted = counter(metrics, "inferd_spec_decode_accepted_tokens_total") - before
    drafted = counter(metrics, "vllm:spec_decode_num_draft_tokens_total")
    plain = client.chat.completions.create(model=model, messages=QUOTE, max_tokens=48, temperature=0, logprobs=True,
                                           top_logprobs=2, extra_body={"speculative": False})
    assert counter(metrics, "vllm:spec_decode_num_draft_tokens_total") == drafted, "the opted-out request drafted"
    assert spec.choices[0].message.content == plain.choices[0].message.content
    assert "quick brown fox" in spec.choices[0].message.content, "the model quotes its prompt"
    assert accepted >= 10, f"a quote's drafts are kept ({accepted} accepted)"
    assert counter(metrics, "vllm:spec_decode_num_accepted_tokens_total") >= accepted
    assert spec.usage.completion_tokens == plain.usage.completion_tokens
    got = [(t.token, round(t.logprob, 3)) for t in spec.choices[0].logprobs.content]
    want = [(t.token, round(t.logprob, 3)) for t in plain.choices[0].logprobs.content]
    assert got == want


def test_streams_seeds_and_stop_strings_behave_as_without_speculation(served):
    s, client, model, metrics = served
    stream = client.chat.completions.create(model=model, messages=QUOTE, max_tokens=40, temperature=0, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    whole = client.chat.completions.create(model=model, messages=QUOTE, max_tokens=40, temperature=0,
                                           extra_body={"speculative": False})
    assert streamed == whole.choices[0].message.content
    # Seeded sampling: a row draws with its position's own number, drafts or not, so the choices are the same.
    seeded = dict(model=model, messages=QUOTE, max_tokens=32, temperature=0.8, top_p=0.95, seed=11, n=2)
    a = client.chat.completions.create(**seeded)
    b = client.chat.completions.create(**seeded, extra_body={"speculative": False})
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    # A stop string inside the quote ends both answers at the same place, before it.
    stop = dict(model=model, messages=QUOTE, max_tokens=48, temperature=0, stop=["lazy"])
    x = client.chat.completions.create(**stop)
    y = client.chat.completions.create(**stop, extra_body={"speculative": False})
    assert x.choices[0].message.content == y.choices[0].message.content
    assert "lazy" not in x.choices[0].message.content and x.choices[0].finish_reason == "stop"
