"""The OpenAI-compatible HTTP API through real clients: the official `openai` SDK, curl, raw sockets. The bundled
SmolLM2 answers questions; greedy answers equal the gRPC API's for the same request."""
import http.client
import json
import socket
import subprocess
import time

import openai
import pytest

from conftest import openai_client, smollm2_server, inferd_pb2 as pb, wait_until_idle

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm2():
    s = smollm2_server()
    yield s
    assert s.stop() == 0, s.logs()


@pytest.fixture(scope="module")
def sdk(smollm2):
    return openai_client(smollm2, timeout=120)


@pytest.fixture(scope="module")
def client(sdk):
    return sdk[0]


@pytest.fixture(scope="module")
def model(sdk):
    return sdk[1]


def sse_events(raw):
    """Server-Sent Events framing, checked: events are 'data: ' lines ended by a blank line, the last [DONE]."""
    assert raw.endswith("\n\n"), raw[-80:]
    events = raw[:-2].split("\n\n")
    for e in events:
        assert e.startswith("data: ") and "\n" not in e, e
    assert events[-1] == "data: [DONE]", events[-1]
    return [json.loads(e[len("data: "):]) for e in events[:-1]]


def test_chat_answers_through_the_sdk(client, model):
    r = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=24, temperature=0)
    (choice,) = r.choices
    assert "Paris" in choice.message.content and choice.message.role == "assistant"
    assert choice.finish_reason == "stop" and r.object == "chat.completion" and r.model == model
    assert r.usage.prompt_tokens > 5 and 0 < r.usage.completion_tokens <= 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_equals_the_grpc_answer(smollm2, client, model):
    r = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=24, temperature=0)
    g = smollm2.stub.Generate(pb.GenerateRequest(
        messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=QUESTION[0]["content"])]),
        sampling=pb.SamplingParams(temperature=0), stopping=pb.StoppingParams(max_tokens=24)))
    assert r.choices[0].message.content == g.text
    assert r.usage.completion_tokens == g.usage.completion_tokens


def test_streamed_chat_equals_the_whole_answer_and_ends_with_usage(client, model):
    whole = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=24, temperature=0)
    chunks = list(client.chat.completions.create(model=model, messages=QUESTION, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_take_text_lists_and_token_ids(smollm2, client, model):
    ids = list(smollm2.stub.Tokenize(pb.TokenizeRequest(text="The capital of France is")).token_ids)
    r = client.completions.create(model=model, prompt=["The capital of France is", ids], max_tokens=4,
                                  temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].text == r.choices[1].text and "Paris" in r.choices[0].text
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=4, temperature=0, stream=True))
    assert streamed == r.choices[0].text


def test_logprobs_are_the_greedy_tokens_and_their_alternatives(client, model):
    r = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=8, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        tops = [a.logprob for a in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert t.token == t.top_logprobs[0].token and t.logprob == pytest.approx(tops[0], abs=1e-5)
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token
    assert "".join(t.token for t in content).strip().startswith(r.choices[0].message.content.strip()[:5])
    c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=3, temperature=0,
                                  logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert "".join(lp.tokens) == c.choices[0].text and all(len(t) == 2 for t in lp.top_logprobs)


def test_echo_with_logprobs_scores_the_prompt_as_lm_eval_reads_it(smollm2, client, model):
    # lm-evaluation-harness's local-completions loglikelihood request: token ids, echo, logprobs, one new token.
    ids = list(smollm2.stub.Tokenize(pb.TokenizeRequest(text="The capital of France is Paris")).token_ids)
    r = client.completions.create(model=model, prompt=ids, echo=True, logprobs=2, max_tokens=1, temperature=0)
    (c,) = r.choices
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, "nothing before the first token scores it"
    assert all(v <= 0 for v in lp.token_logprobs[1:]) and all(len(t) == 2 for t in lp.top_logprobs[1:])
    prompt_text = smollm2.stub.Detokenize(pb.DetokenizeRequest(token_ids=ids, skip_special_tokens=False)).text
    assert c.text.startswith(prompt_text) and "".join(lp.tokens) == c.text
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    # The prompt's logprobs are the gRPC API's prompt_logprobs for the same ids.
    req = pb.GenerateRequest(sampling=pb.SamplingParams(temperature=0), stopping=pb.StoppingParams(max_tokens=1),
                             output=pb.OutputOptions(prompt_logprobs=2))
    req.token_ids.ids.extend(ids)
    g = smollm2.stub.Generate(req)
    assert lp.token_logprobs[1:len(ids)] == pytest.approx([p.logprob for p in g.prompt_logprobs], abs=1e-4)
    # A text prompt echoes its text; without logprobs there are none.
    t = client.completions.create(model=model, prompt="The capital of France is", echo=True, max_tokens=3,
                                  temperature=0)
    assert t.choices[0].text.startswith("The capital of France is") and t.choices[0].logprobs is None
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model=model, prompt="The capital of France is", echo=True, max_tokens=3, temperature=0, stream=True))
    assert streamed == t.choices[0].text


def test_n_choices_share_the_prompt_and_a_seed_reproduces_them(smollm2, client, model):
    prompt = "Write one sentence about the sea. " * 4
    kw = dict(model=model, prompt=prompt, max_tokens=12, temperature=1.0, n=3, seed=11)
    before = smollm2.stub.GetServerInfo(pb.GetServerInfoRequest()).prefix_cache_hit_tokens
    a = client.completions.create(**kw)
    after = smollm2.stub.GetServerInfo(pb.GetServerInfoRequest()).prefix_cache_hit_tokens
    assert sorted(c.index for c in a.choices) == [0, 1, 2]
    assert len({c.text for c in a.choices}) > 1  # the choices differ
    # Choices 1 and 2 found the prompt's full blocks that choice 0 computed.
    assert after - before >= 2 * (a.usage.prompt_tokens // 16) * 16 > 0
    b = client.completions.create(**kw)
    assert [c.text for c in b.choices] == [c.text for c in a.choices]
    assert b.usage.prompt_tokens_details.cached_tokens >= (a.usage.prompt_tokens // 16) * 16


def test_stop_strings_end_the_answer_before_them(client, model):
    r = client.completions.create(model=model, prompt="Count: 1, 2, 3, 4,", max_tokens=30, temperature=0,
                                  stop=[" 7"])
    assert r.choices[0].finish_reason == "stop" and " 7" not in r.choices[0].text and " 6" in r.choices[0].text


def test_errors_are_the_sdks_own_exceptions_naming_the_field(client, model):
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(model=model, messages=QUESTION, tools=[{"type": "retrieval"}])
    with pytest.raises(openai.BadRequestError, match="suffix is not supported"):
        client.completions.create(model=model, prompt="a", suffix="b")
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(model=model, messages=QUESTION, response_format={"type": "yaml"})
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=model, messages=QUESTION, temperature=-1)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model=model, messages=QUESTION, max_tokens=10**6)
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\].content\[0\]"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.chat.completions.create(model="gpt-4o", messages=QUESTION)


def post(url, path, body, headers=None):
    host = url.split("//")[1]
    conn = http.client.HTTPConnection(host, timeout=30)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    return r.status, r.read().decode()


def test_bad_bodies_and_routes_get_openai_errors(smollm2):
    url = smollm2.http_url
    for body, status, words in [
            ("{not json", 400, "not valid JSON"),
            ("[1, 2]", 400, "one JSON object"),
            ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "12"}', 400, "max_tokens"),
            ('{"messages": [{"role": "user", "content": "hi"}], "echo": true}', 400, "echo"),
            ('{"messages": []}', 400, "messages")]:
        got, text = post(url, "/v1/chat/completions", body)
        assert got == status and words in json.loads(text)["error"]["message"], (body, got, text)
        assert json.loads(text)["error"]["type"] == "invalid_request_error"
    got, text = post(url, "/v1/chat/completions", "x" * (5 << 20))
    assert got == 413 and "max_request_bytes" in text
    got, text = post(url, "/v1/nothing", "{}")
    assert got == 404 and json.loads(text)["error"]["code"] == 404
    conn = http.client.HTTPConnection(url.split("//")[1], timeout=10)
    conn.request("GET", "/v1/chat/completions")
    r = conn.getresponse()
    assert r.status == 405 and r.getheader("Allow") == "POST"


def test_health_and_metrics(smollm2):
    conn = http.client.HTTPConnection(smollm2.http_url.split("//")[1], timeout=10)
    conn.request("GET", "/health")
    assert conn.getresponse().status == 200
    conn = http.client.HTTPConnection(smollm2.http_url.split("//")[1], timeout=10)
    conn.request("GET", "/metrics")
    r = conn.getresponse()
    body = r.read().decode()
    assert r.status == 200 and "inferd_requests_total" in body and r.getheader("Content-Type").startswith("text/plain")


def test_curl_streams_server_sent_events(smollm2, model):
    body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 5, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    out = subprocess.run(["curl", "-sN", "--fail-with-body", "-H", "Content-Type: application/json", "-d", body,
                          smollm2.http_url + "/v1/completions"], capture_output=True, text=True, timeout=60, check=True)
    events = sse_events(out.stdout)
    assert len(events) >= 2 and events[-1]["usage"]["completion_tokens"] == 5 and events[-1]["choices"] == []
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert "Paris" in "".join(e["choices"][0]["text"] for e in events[:-1])


def test_a_client_gone_mid_stream_cancels_its_request_at_once(smollm2, model):
    body = json.dumps({"model": model, "prompt": "Tell me a very long story.", "max_tokens": 4000,
                       "ignore_eos": True, "stream": True}).encode()
    host, port = smollm2.http_url.split("//")[1].split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(65536)
    assert smollm2.stub.GetServerInfo(pb.GetServerInfoRequest()).running_requests == 1
    s.close()
    start = time.time()
    info = wait_until_idle(smollm2.stub, timeout=5)
    assert info.running_requests == 0 and info.free_kv_blocks == info.total_kv_blocks
    assert time.time() - start < 2


def test_logit_bias_bans_and_forces_tokens(smollm2, client, model):
    base = client.completions.create(model=model, prompt="The capital of France is", max_tokens=3, temperature=0,
                                     logprobs=1)
    first = base.choices[0].logprobs.tokens[0]
    (first_id,) = smollm2.stub.Tokenize(pb.TokenizeRequest(text=first, add_special_tokens=False)).token_ids
    banned = client.completions.create(model=model, prompt="The capital of France is", max_tokens=3, temperature=0,
                                       logprobs=1, logit_bias={str(first_id): -100})
    assert banned.choices[0].logprobs.tokens[0] != first
    # The reported logprobs stay the model's own: the banned token is still the top alternative.
    assert first in banned.choices[0].logprobs.top_logprobs[0]
    comma = smollm2.stub.Detokenize(pb.DetokenizeRequest(token_ids=[28])).text
    forced = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4, temperature=0.9,
                                       seed=3, logprobs=1, logit_bias={"28": 100})
    assert forced.choices[0].logprobs.tokens == [comma] * 4, forced.choices[0].logprobs.tokens
    with pytest.raises(openai.BadRequestError, match=r"logit_bias\[5\]"):
        client.completions.create(model=model, prompt="x", logit_bias={"5": 101})
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.completions.create(model=model, prompt="x", logit_bias={"99999999": 1})
