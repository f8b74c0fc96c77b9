"""The attack battery: what a hostile client or a careless one sends, through the real server. Every case
asserts the exact status code and the field its message names; the autouse fixture in conftest.py checks that
health and GetServerInfo stayed fast and that afterwards nothing runs and every KV block is free."""
import random
import threading
import time

import grpc
import pytest

from conftest import inferd_pb2 as pb

VOCAB = 640  # llama3-tiny


def greedy(text="Hello", max_tokens=16, **kw):
    return pb.GenerateRequest(text=text, sampling=pb.SamplingParams(temperature=0),
                              stopping=pb.StoppingParams(max_tokens=max_tokens, ignore_eos=True), **kw)


def expect_error(call, request, code, field):
    with pytest.raises(grpc.RpcError) as e:
        result = call(request)
        if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)):
            list(result)
    assert e.value.code() == code, (e.value.code(), e.value.details())
    assert field in e.value.details(), e.value.details()


def raw_call(server, method, stream=False):
    make = server.channel.unary_stream if stream else server.channel.unary_unary
    return make(f"/inferd.v1.Inference/{method}", request_serializer=lambda b: b, response_deserializer=lambda b: b)


def test_random_bytes_to_every_rpc_are_answered_never_with_an_internal_error(server):
    rng = random.Random(7)
    for method in ["Generate", "GenerateStream", "Tokenize", "Detokenize", "GetModelInfo", "GetServerInfo", "Abort"]:
        call = raw_call(server, method, stream=method == "GenerateStream")
        for _ in range(60):
            raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
            try:
                result = call(raw, timeout=5)
                if method == "GenerateStream":
                    list(result)
            except grpc.RpcError as e:
                assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS), \
                    (method, raw, e.code(), e.details())


@pytest.mark.parametrize("build, field", [
    (lambda: pb.GenerateRequest(request_id="XYZ", text="hi"), "GenerateRequest"),
    (lambda: pb.GenerateRequest(text="XYZ"), "GenerateRequest"),
    (lambda: pb.GenerateRequest(text="hi", stopping=pb.StoppingParams(stop=["XYZ"])), "GenerateRequest"),
    (lambda: pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="XYZ", content="a")])),
     "GenerateRequest"),
    (lambda: pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="XYZ")])),
     "GenerateRequest"),
])
def test_invalid_utf8_in_every_string_field_of_generate(server, build, field):
    raw = build().SerializeToString().replace(b"XYZ", b"\xff\xfeZ")
    for method, stream in [("Generate", False), ("GenerateStream", True)]:
        expect_error(raw_call(server, method, stream), raw, grpc.StatusCode.INVALID_ARGUMENT, field)


@pytest.mark.parametrize("method, message", [("Tokenize", pb.TokenizeRequest(text="XYZ")),
                                             ("Abort", pb.AbortRequest(request_id="XYZ"))])
def test_invalid_utf8_in_the_other_rpcs(server, method, message):
    raw = message.SerializeToString().replace(b"XYZ", b"\xff\xfeZ")
    expect_error(raw_call(server, method), raw, grpc.StatusCode.INVALID_ARGUMENT, type(message).__name__)


def test_ten_megabyte_texts_are_refused_naming_the_limit(server):
    text = "a" * (10 << 20)
    expect_error(server.stub.Generate, pb.GenerateRequest(text=text), grpc.StatusCode.INVALID_ARGUMENT,
                 "server.max_request_bytes")
    expect_error(server.stub.GenerateStream, pb.GenerateRequest(text=text), grpc.StatusCode.INVALID_ARGUMENT,
                 "server.max_request_bytes")
    expect_error(server.stub.Tokenize, pb.TokenizeRequest(text=text), grpc.StatusCode.INVALID_ARGUMENT,
                 "server.max_request_bytes")


def test_a_million_token_ids_are_refused_naming_max_model_len(server):
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[7] * 1_000_000))
    expect_error(server.stub.Generate, req, grpc.StatusCode.INVALID_ARGUMENT, "max_model_len")
    expect_error(server.stub.Detokenize, pb.DetokenizeRequest(token_ids=[7] * 999_999 + [VOCAB]),
                 grpc.StatusCode.INVALID_ARGUMENT, "token_ids[999999]")


def test_pathological_inputs_tokenize_in_linear_time(server):
    # Ten times the input may take at most ~30 times as long (linear: 10; the quadratic tokenizer took 100).
    # A ratio, so that slow builds (sanitizers) measure the same thing.
    def took(text):
        t0 = time.monotonic()
        assert server.stub.Tokenize(pb.TokenizeRequest(text=text), timeout=120).token_ids
        return time.monotonic() - t0

    for unit in ["a", " ", "😀", "日本語"]:
        small = took(unit * ((100 << 10) // len(unit.encode())))
        big = took(unit * ((1 << 20) // len(unit.encode())))
        assert big < 30 * small + 0.2, f"{unit!r}: 100 KB {small:.3f} s, 1 MB {big:.3f} s"
    # The same through Generate: tokenized, then refused for its length.
    expect_error(server.stub.Generate, pb.GenerateRequest(text="a" * (1 << 20)), grpc.StatusCode.INVALID_ARGUMENT,
                 "max_model_len")


@pytest.mark.parametrize("field, value", [
    ("temperature", float("nan")), ("temperature", float("inf")), ("temperature", -1e-30), ("temperature", 100.5),
    ("top_p", 0.0), ("top_p", float("nan")), ("min_p", 1.0000001), ("top_k", -1), ("top_k", VOCAB + 1),
    ("repetition_penalty", 0.0), ("repetition_penalty", 10.5), ("presence_penalty", -2.5),
    ("frequency_penalty", float("-inf")),
])
def test_sampling_values_outside_their_ranges_are_refused_naming_the_field(server, field, value):
    req = greedy()
    setattr(req.sampling, field, value)
    expect_error(server.stub.Generate, req, grpc.StatusCode.INVALID_ARGUMENT, f"sampling.{field}")


def test_extreme_sampling_values_inside_their_ranges_generate_valid_tokens(server):
    for sampling in [
        pb.SamplingParams(temperature=100, repetition_penalty=1e-45, seed=1),
        pb.SamplingParams(temperature=1e-30, top_p=1e-38, seed=2),
        pb.SamplingParams(temperature=1, min_p=1.0, top_k=VOCAB, seed=3),
        pb.SamplingParams(temperature=2, repetition_penalty=10, presence_penalty=2, frequency_penalty=-2, seed=4),
    ]:
        r = server.stub.Generate(pb.GenerateRequest(text="Hello Hello Hello", sampling=sampling,
                                                    stopping=pb.StoppingParams(max_tokens=24, ignore_eos=True),
                                                    output=pb.OutputOptions(top_logprobs=3)))
        assert len(r.token_ids) == 24 and all(0 <= t < VOCAB for t in r.token_ids)
        for lp in r.logprobs:
            assert lp.logprob == lp.logprob and lp.logprob <= 0, lp  # not NaN
            assert all(t.logprob == t.logprob for t in lp.top)


def test_huge_and_numerous_stop_strings_are_refused_naming_the_field(server):
    req = greedy()
    req.stopping.stop.append("x" * (1 << 20))
    expect_error(server.stub.Generate, req, grpc.StatusCode.INVALID_ARGUMENT, "stopping.stop[0]")
    req = greedy()
    req.stopping.stop.extend(f"s{i}" for i in range(10_000))
    expect_error(server.stub.Generate, req, grpc.StatusCode.INVALID_ARGUMENT, "stopping.stop")
    req = greedy()
    req.stopping.stop_token_ids.extend([3] * 10_000)
    expect_error(server.stub.Generate, req, grpc.StatusCode.INVALID_ARGUMENT, "stopping.stop_token_ids")


def test_a_duplicate_live_id_is_already_exists(server):
    first = server.stub.GenerateStream(greedy(max_tokens=400, request_id="dup"))
    next(first)
    expect_error(server.stub.Generate, greedy(request_id="dup"), grpc.StatusCode.ALREADY_EXISTS, "request_id 'dup'")
    assert server.stub.Abort(pb.AbortRequest(request_id="dup")).found
    assert list(first)[-1].finish_reason == pb.ABORTED


def test_abort_races_end_each_request_once(server):
    streams = {f"race-{i}": server.stub.GenerateStream(greedy(max_tokens=200, request_id=f"race-{i}"))
               for i in range(24)}
    ends, errors = {}, []

    def consume(rid, s):
        try:
            ends[rid] = list(s)[-1].finish_reason
        except grpc.RpcError as e:
            errors.append((rid, e.code()))

    threads = [threading.Thread(target=consume, args=item) for item in streams.items()]
    for t in threads:
        t.start()
    rng = random.Random(3)
    for _ in range(200):  # aborts of live, finished and unknown ids, in any order
        server.stub.Abort(pb.AbortRequest(request_id=rng.choice(list(streams) + ["nobody", "race-x"])))
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert set(ends.values()) <= {pb.ABORTED, pb.LENGTH} and len(ends) == 24


def test_deadlines_from_1_to_500_ms_end_with_deadline_exceeded(server):
    futures = [(ms, server.stub.Generate.future(greedy(max_tokens=400), timeout=ms / 1000))
               for ms in [1, 2, 5, 10, 20, 50, 100, 200, 300, 500] * 3]
    for ms, f in futures:
        try:
            f.result()  # a fast finish is fine
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, (ms, e.code(), e.details())


def test_abrupt_disconnects_free_every_block(server):
    for _ in range(3):
        channels = [grpc.insecure_channel(server.address) for _ in range(8)]
        streams = [server.stub.__class__(c).GenerateStream(greedy(max_tokens=400)) for c in channels]
        for s in streams:
            next(s)
        for c in channels:
            c.close()  # no cancel, no goodbye


def test_a_burst_over_the_queue_is_resource_exhausted_and_the_rest_finish(server):
    futures = [server.stub.Generate.future(greedy(max_tokens=64)) for _ in range(200)]
    codes = []
    for f in futures:
        try:
            f.result(timeout=120)
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as e:
            codes.append(e.code())
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                assert "max_queue" in e.details() or "prepared" in e.details(), e.details()
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, set(codes)
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes and grpc.StatusCode.OK in codes
