"""Generation through the real server: streaming, unary, tokenize, batching, cancellation."""
import json
import os
import re
import threading
import time
import urllib.request

import grpc
import pytest
from tokenizers import Tokenizer

from conftest import (MODELS, SOURCE_DIR, Server, assert_half_cancelled_and_every_block_free, cancel_half_of_streams,
                      free_port, inferd_pb2 as pb)

PROMPTS = ["The scheduler batches tokens", "Hello world", "def forward(self, x):", "日本語のテキスト 😀",
           "the model serves requests", "paged cache of blocks", "I'm here, you're there", "1234 5678"]


def greedy(text=None, ids=None, max_tokens=16, **kw):
    req = pb.GenerateRequest(sampling=pb.SamplingParams(temperature=0),
                             stopping=pb.StoppingParams(max_tokens=max_tokens, ignore_eos=True), **kw)
    if text is not None:
        req.text = text
    else:
        req.token_ids.ids.extend(ids)
    return req


def collect(stream):
    ids, text, chunks = [], "", list(stream)
    for c in chunks:
        ids.extend(c.token_ids)
        text += c.text
    return ids, text, chunks


def test_stream_and_unary_agree_and_text_is_the_detokenized_ids(server):
    ids, text, chunks = collect(server.stub.GenerateStream(greedy("Hello world", max_tokens=20)))
    assert len(ids) == 20
    assert chunks[-1].finish_reason == pb.LENGTH
    assert all(c.finish_reason == pb.FINISH_REASON_UNSPECIFIED for c in chunks[:-1]), "finish only on the last"
    assert chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == len(server.stub.Tokenize(pb.TokenizeRequest(text="Hello world")).token_ids)
    assert chunks[-1].timing.total_s >= chunks[-1].timing.time_to_first_token_s > 0
    unary = server.stub.Generate(greedy("Hello world", max_tokens=20))
    assert list(unary.token_ids) == ids and unary.text == text and unary.finish_reason == pb.LENGTH
    # The streamed text is exactly what detokenizing the generated ids in context gives.
    prompt = list(server.stub.Tokenize(pb.TokenizeRequest(text="Hello world")).token_ids)
    whole = server.stub.Detokenize(pb.DetokenizeRequest(token_ids=prompt + ids)).text
    assert whole.endswith(text)


def test_request_id_is_echoed_or_assigned(server):
    chunks = list(server.stub.GenerateStream(greedy("Hi", max_tokens=2, request_id="my-id-1")))
    assert all(c.request_id == "my-id-1" for c in chunks)
    chunks = list(server.stub.GenerateStream(greedy("Hi", max_tokens=2)))
    assert chunks[0].request_id and all(c.request_id == chunks[0].request_id for c in chunks)
    # Assigned ids are 128 random bits, so no client can guess (and abort) another's request.
    ids = {server.stub.Generate(greedy("Hi", max_tokens=1)).request_id for _ in range(20)}
    assert len(ids) == 20
    assert all(re.fullmatch(r"req-[0-9a-f]{32}", i) for i in ids), ids


def test_greedy_tokens_match_transformers_reference(server):
    ref = json.load(open(os.path.join(SOURCE_DIR, "tests/fixtures/reference/llama3-tiny.json")))
    for case in ref["cases"]:
        want = [s["token"] for s in case["steps"]]
        got = list(server.stub.Generate(greedy(ids=case["prompt_ids"], max_tokens=len(want))).token_ids)
        assert len(got) == len(want), "ignore_eos: exactly max_tokens come back"
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                assert case["steps"][i]["margin"] < 1e-2, f"step {i}: {g} != {w}"
                break


def test_tokenize_matches_hugging_face_and_round_trips(server):
    hf = Tokenizer.from_file(os.path.join(MODELS, "llama3-tiny", "tokenizer.json"))
    for text in PROMPTS + ["  spaces  and\ttabs\n\n", "emoji 👍🏽 ❤️"]:
        ids = list(server.stub.Tokenize(pb.TokenizeRequest(text=text)).token_ids)
        assert ids == hf.encode(text).ids
        no_bos = list(server.stub.Tokenize(pb.TokenizeRequest(text=text, add_special_tokens=False)).token_ids)
        assert no_bos == hf.encode(text, add_special_tokens=False).ids
        assert server.stub.Detokenize(pb.DetokenizeRequest(token_ids=ids)).text == text
    with_special = server.stub.Detokenize(pb.DetokenizeRequest(token_ids=ids, skip_special_tokens=False)).text
    assert with_special.startswith("<|begin_of_text|>")


def test_logprobs_when_asked(server):
    r = server.stub.Generate(greedy("Hello", max_tokens=4, output=pb.OutputOptions(top_logprobs=3)))
    assert len(r.logprobs) == 4 and len(r.token_ids) == 4
    for tok, lp in zip(r.token_ids, r.logprobs):
        assert lp.token_id == tok and len(lp.top) == 3
        assert lp.top[0].token_id == tok, "greedy picks the top token"
        assert lp.top[0].logprob >= lp.top[1].logprob >= lp.top[2].logprob
        assert lp.logprob <= 0
    assert len(server.stub.Generate(greedy("Hello", max_tokens=2)).logprobs) == 0


def test_prompt_logprobs_score_the_prompt_as_generation_scored_its_tokens(server):
    # Generate, then send the prompt and what was generated as one prompt: its prompt logprobs over the generated
    # part are the logprobs the generation reported, and they arrive on the first chunk.
    prompt = list(server.stub.Tokenize(pb.TokenizeRequest(text="The scheduler batches tokens")).token_ids)
    gen = server.stub.Generate(greedy(ids=prompt, max_tokens=12, output=pb.OutputOptions(top_logprobs=2)))
    whole = prompt + list(gen.token_ids)
    scored = greedy(ids=whole, max_tokens=3, output=pb.OutputOptions(prompt_logprobs=2))
    chunks = list(server.stub.GenerateStream(scored))
    assert len(chunks[0].prompt_logprobs) == len(whole) - 1
    assert all(len(c.prompt_logprobs) == 0 for c in chunks[1:]), "only the first chunk carries them"
    rows = chunks[0].prompt_logprobs
    assert [r.token_id for r in rows] == whole[1:]
    assert all(len(r.top) == 2 and r.logprob <= 0 for r in rows)
    for row, lp in zip(rows[len(prompt) - 1:], gen.logprobs):
        assert abs(row.logprob - lp.logprob) < 1e-3, (row, lp)
        assert [t.token_id for t in row.top] == [t.token_id for t in lp.top]
    # The whole prompt is computed even though its blocks are cached now, and unary carries the same rows.
    unary = server.stub.Generate(scored)
    assert unary.usage.cached_prompt_tokens == 0
    assert [round(r.logprob, 4) for r in unary.prompt_logprobs] == [round(r.logprob, 4) for r in rows]
    assert len(server.stub.Generate(greedy(ids=whole, max_tokens=1)).prompt_logprobs) == 0, "none unless asked"


def test_seeded_sampling_is_reproducible(server):
    def sample(seed):
        return list(server.stub.Generate(pb.GenerateRequest(
            text="Hello", sampling=pb.SamplingParams(temperature=1.0, top_p=0.9, seed=seed),
            stopping=pb.StoppingParams(max_tokens=24, ignore_eos=True))).token_ids)
    assert sample(5) == sample(5)
    assert sample(5) != sample(6)


def test_stop_string_and_stop_token(server):
    full = server.stub.Generate(greedy("Hello world", max_tokens=24))
    stop = full.text[len(full.text) // 2:len(full.text) // 2 + 3]
    assert len(stop) == 3
    r = server.stub.Generate(pb.GenerateRequest(
        text="Hello world", sampling=pb.SamplingParams(temperature=0),
        stopping=pb.StoppingParams(max_tokens=24, ignore_eos=True, stop=[stop])))
    assert r.finish_reason == pb.STOP_STRING
    assert r.text == full.text[:full.text.index(stop)]
    r = server.stub.Generate(pb.GenerateRequest(
        text="Hello world", sampling=pb.SamplingParams(temperature=0),
        stopping=pb.StoppingParams(max_tokens=24, ignore_eos=True, stop=[stop], include_stop_str_in_output=True)))
    assert r.text == full.text[:full.text.index(stop) + 3]
    tok = full.token_ids[5]
    r = server.stub.Generate(pb.GenerateRequest(
        text="Hello world", sampling=pb.SamplingParams(temperature=0),
        stopping=pb.StoppingParams(max_tokens=24, ignore_eos=True, stop_token_ids=[tok])))
    assert r.finish_reason == pb.STOP_TOKEN
    assert list(r.token_ids) == list(full.token_ids)[:list(full.token_ids).index(tok) + 1]


def test_a_stop_string_ends_the_request_in_the_engine_before_the_answer_ends():
    """The server matches stop strings in the text and tells the engine; the answer ends once the engine took it:
    the tokens up to the stop string's last, usage counting them, no request left running, every block free, the
    id free again at once, and the engine's own count (metrics) the same."""
    port = free_port()
    server = Server(server={"metrics_listen": f"127.0.0.1:{port}"})
    try:
        full = server.stub.Generate(greedy("The scheduler batches tokens", max_tokens=200))
        stop = full.text[len(full.text) // 8:len(full.text) // 8 + 4]
        assert len(stop) == 4 and full.finish_reason == pb.LENGTH
        want_text = full.text[:full.text.index(stop)]
        req = pb.GenerateRequest(text="The scheduler batches tokens", request_id="stopped-by-text",
                                 sampling=pb.SamplingParams(temperature=0),
                                 stopping=pb.StoppingParams(max_tokens=200, ignore_eos=True, stop=[stop]))
        generated = 0
        for answer in ("stream", "unary"):
            if answer == "stream":
                ids, text, chunks = collect(server.stub.GenerateStream(req))
                last = chunks[-1]
            else:
                last = server.stub.Generate(req)
                ids, text = list(last.token_ids), last.text
            assert last.finish_reason == pb.STOP_STRING, answer
            assert text == want_text, answer
            assert 0 < len(ids) < 200 and ids == list(full.token_ids)[:len(ids)], answer
            assert last.usage.completion_tokens == len(ids), answer
            generated += len(ids)
            info = server.stub.GetServerInfo(pb.GetServerInfoRequest())
            assert info.running_requests == 0 and info.free_kv_blocks == info.total_kv_blocks, answer
        assert server.stub.Generate(greedy("Hello", max_tokens=2, request_id="stopped-by-text")).usage.completion_tokens
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        assert 'inferd_request_success_total{finish_reason="stop_string"} 2' in metrics
        assert f"inferd_request_generation_tokens_sum {200 + generated + 2}" in metrics
    finally:
        assert server.stop() == 0, server.logs()


def test_32_concurrent_streams_each_equal_their_solo_run(server):
    solo = {p: server.stub.Generate(greedy(p, max_tokens=40)) for p in PROMPTS}
    results, errors = {}, []

    def run(i):
        p = PROMPTS[i % len(PROMPTS)]
        try:
            results[i] = collect(server.stub.GenerateStream(greedy(p, max_tokens=40)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(results) == 32
    for i, (ids, text, chunks) in results.items():
        want = solo[PROMPTS[i % len(PROMPTS)]]
        assert ids == list(want.token_ids), f"stream {i}"
        assert text == want.text
        assert chunks[-1].finish_reason == pb.LENGTH


def test_cancelling_half_of_32_streams_frees_every_block(server):
    done, errors = cancel_half_of_streams(server.stub, [greedy(PROMPTS[i % len(PROMPTS)], max_tokens=300)
                                                        for i in range(32)])
    assert_half_cancelled_and_every_block_free(server.stub, done, errors, 32, 300)


def test_abort_rpc_ends_the_stream_with_aborted(server):
    stream = server.stub.GenerateStream(greedy("Hello", max_tokens=400, request_id="to-abort"))
    first = next(stream)
    assert first.request_id == "to-abort"
    assert server.stub.Abort(pb.AbortRequest(request_id="to-abort")).found
    rest = list(stream)
    assert rest[-1].finish_reason == pb.ABORTED
    assert not server.stub.Abort(pb.AbortRequest(request_id="to-abort")).found


def test_model_and_server_info(server):
    m = server.stub.GetModelInfo(pb.GetModelInfoRequest())
    assert m.architecture == "LlamaForCausalLM" and m.vocab_size == 640 and m.block_size == 16
    assert m.max_model_len == 512 and len(m.eos_token_ids) == 2 and m.dtype == "bfloat16"
    s = server.stub.GetServerInfo(pb.GetServerInfoRequest())
    assert s.version and s.backend == "cpu" and not s.draining and s.total_kv_blocks > 0
    mp = s.memory_plan  # as allocated: the pool has exactly its blocks, and the parts add up to the budget
    assert mp.device == "cpu" and mp.num_blocks == s.total_kv_blocks and mp.kv_dtype == "float32"
    assert mp.kv_bytes == mp.num_blocks * mp.kv_bytes_per_block > 0
    assert mp.budget_bytes == mp.weight_bytes + mp.activation_bytes + mp.other_bytes + mp.kv_bytes
    assert mp.weight_bytes > 0 and mp.activation_bytes > 0
    # What runs each operation, as the start-up log says it too.
    kernels = {k.op: k.choice for k in s.kernels}
    assert list(kernels) == ["products", "attention", "sampling"] and "OpenBLAS" in kernels["products"], kernels
    assert "cpu kernels on cpu: products: OpenBLAS" in server.logs()


def test_a_shared_prefix_is_reused_and_changes_no_output(server):
    # The same long prompt twice: the second reuses every full block but the last token's, and generates the
    # same greedy tokens and logprobs as the first.
    prompt = " ".join(["the model serves requests over a paged cache of blocks"] * 12)
    first = server.stub.Generate(greedy(prompt, max_tokens=24, output=pb.OutputOptions(top_logprobs=2)))
    second = server.stub.Generate(greedy(prompt, max_tokens=24, output=pb.OutputOptions(top_logprobs=2)))
    n = first.usage.prompt_tokens
    assert n > 64
    assert second.usage.cached_prompt_tokens == (n - 1) // 16 * 16, (n, second.usage.cached_prompt_tokens)
    assert list(second.token_ids) == list(first.token_ids)
    for a, b in zip(first.logprobs, second.logprobs):
        assert abs(a.logprob - b.logprob) < 1e-4
    # Another question after the same long preamble reuses the preamble's blocks.
    other = server.stub.Generate(greedy(prompt + " and answers", max_tokens=4))
    assert other.usage.cached_prompt_tokens >= (n - 1) // 16 * 16 - 16
