"""Every bad input ends the RPC with the right status code and a message naming the field."""
import time

import grpc
import pytest

from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import Server, inferd_pb2 as pb


def req(**kw):
    r = pb.GenerateRequest(text=kw.pop("text", "Hello"))
    for k, v in kw.items():
        section, field = k.split("__")
        setattr(getattr(r, section), field, v)
    return r


BAD = [
    (req(sampling__temperature=float("nan")), "sampling.temperature"),
    (req(sampling__temperature=float("inf")), "sampling.temperature"),
    (req(sampling__temperature=-0.5), "sampling.temperature"),
    (req(sampling__top_p=0.0), "sampling.top_p"),
    (req(sampling__top_p=1.5), "sampling.top_p"),
    (req(sampling__top_k=-1), "sampling.top_k"),
    (req(sampling__min_p=2.0), "sampling.min_p"),
    (req(sampling__repetition_penalty=0.0), "sampling.repetition_penalty"),
    (req(sampling__presence_penalty=3.0), "sampling.presence_penalty"),
    (req(sampling__frequency_penalty=float("-inf")), "sampling.frequency_penalty"),
    (req(stopping__max_tokens=0), "stopping.max_tokens"),
    (req(stopping__max_tokens=5, stopping__min_tokens=6), "stopping.min_tokens"),
    (req(stopping__max_tokens=100000), "max_model_len"),
    (req(text="x " * 600), "max_model_len"),
    (req(output__top_logprobs=21), "output.top_logprobs"),
    (req(output__prompt_logprobs=-1), "output.prompt_logprobs"),
    (pb.GenerateRequest(), "prompt"),
    (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[])), "prompt"),
    (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 640])), "token_ids.ids[1]"),
    (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[-3])), "token_ids.ids[0]"),
    (pb.GenerateRequest(text="Hi", stopping=pb.StoppingParams(stop_token_ids=[5] * 257)), "stopping.stop_token_ids"),
]


@pytest.mark.parametrize("request_, field", BAD, ids=[f for _, f in BAD])
def test_bad_request_is_invalid_argument_naming_the_field(server, request_, field):
    for call in (server.stub.Generate, lambda r: list(server.stub.GenerateStream(r))):
        with pytest.raises(grpc.RpcError) as e:
            call(request_)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in e.value.details()


def test_empty_stop_string_and_bad_stop_token(server):
    r = pb.GenerateRequest(text="Hi", stopping=pb.StoppingParams(stop=["ok", ""]))
    with pytest.raises(grpc.RpcError) as e:
        server.stub.Generate(r)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "stopping.stop[1]" in e.value.details()
    r = pb.GenerateRequest(text="Hi", stopping=pb.StoppingParams(stop_token_ids=[99999]))
    with pytest.raises(grpc.RpcError) as e:
        server.stub.Generate(r)
    assert "stopping.stop_token_ids[0]" in e.value.details()


def test_invalid_utf8_text_is_invalid_argument(server):
    # Python clients cannot build invalid UTF-8 strings, so the request is serialized by hand.
    raw = pb.GenerateRequest(text="XYZ").SerializeToString().replace(b"XYZ", b"\xff\xfeZ")
    call = server.channel.unary_unary("/inferd.v1.Inference/Generate", request_serializer=lambda b: b,
                                      response_deserializer=pb.GenerateResult.FromString)
    with pytest.raises(grpc.RpcError) as e:
        call(raw)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "UTF-8" in e.value.details()


@pytest.mark.parametrize("method, message", [
    ("Tokenize", "TokenizeRequest"), ("Detokenize", "DetokenizeRequest"), ("GetModelInfo", "GetModelInfoRequest"),
    ("GetServerInfo", "GetServerInfoRequest"), ("Abort", "AbortRequest"), ("Generate", "GenerateRequest"),
    ("GenerateStream", "GenerateRequest")])
def test_malformed_bytes_to_every_rpc_are_invalid_argument_naming_the_message(server, method, message):
    call = (server.channel.unary_stream if method == "GenerateStream" else server.channel.unary_unary)(
        f"/inferd.v1.Inference/{method}", request_serializer=lambda b: b, response_deserializer=lambda b: b)
    bad = [b"\xff\xff\xff\xff", b"\x0a\x05ab"]  # a tag that never ends; a field longer than the message
    if not method.startswith("Get"):  # field 1 is a string (or packed ids): invalid UTF-8 (or a broken varint)
        bad.append(b"\x0a\x03\xff\xfe\xfd")
    for raw in bad:
        with pytest.raises(grpc.RpcError) as e:
            result = call(raw)
            if method == "GenerateStream":
                list(result)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, raw, e.value.code())
        assert message in e.value.details(), e.value.details()
    assert server.stub.GetServerInfo(pb.GetServerInfoRequest()).total_kv_blocks > 0


def test_deadline_aborts_and_frees_blocks(server):
    # gRPC cancels the call at the deadline and the engine aborts it by its handle; the engine's own check of an
    # expired deadline between steps is tested without gRPC (EngineWithFakeBackend in tests/unit/engine_test.cc).
    r = pb.GenerateRequest(text="Hello", sampling=pb.SamplingParams(temperature=0),
                           stopping=pb.StoppingParams(max_tokens=500, ignore_eos=True))
    got = []
    with pytest.raises(grpc.RpcError) as e:
        for chunk in server.stub.GenerateStream(r, timeout=0.03):
            got.extend(chunk.token_ids)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert len(got) < 500, "stopped before its end"
    end = time.time() + 5
    while time.time() < end:
        info = server.stub.GetServerInfo(pb.GetServerInfoRequest())
        if info.running_requests == 0 and info.free_kv_blocks == info.total_kv_blocks:
            break
        time.sleep(0.05)
    assert info.running_requests == 0 and info.free_kv_blocks == info.total_kv_blocks


def test_full_queue_is_resource_exhausted():
    s = Server(scheduler={"max_num_seqs": 1, "max_num_batched_tokens": 64, "max_queue": 1})
    try:
        long = pb.GenerateRequest(text="Hello", sampling=pb.SamplingParams(temperature=0),
                                  stopping=pb.StoppingParams(max_tokens=480, ignore_eos=True))
        running = s.stub.GenerateStream(long)
        next(running)  # it is running now and holds the only seat
        # One seat, one queue slot: of many requests sent at once, some must be refused however fast
        # this machine finishes each one.
        calls = [s.stub.Generate.future(long) for _ in range(16)]
        codes = []
        for c in calls:
            try:
                c.result()
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as e:
                codes.append(e.code())
                if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    assert "max_queue" in e.details()
        assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes
        assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
        running.cancel()
    finally:
        assert s.stop() == 0


def test_oversized_requests_are_invalid_argument_naming_the_limit():
    s = Server(server={"max_request_bytes": 100000})
    try:
        for call, req in [(s.stub.Generate, pb.GenerateRequest(text="a" * 200000)),
                          (s.stub.Tokenize, pb.TokenizeRequest(text="a" * 200000))]:
            with pytest.raises(grpc.RpcError) as e:
                call(req)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "server.max_request_bytes = 100000" in e.value.details()
        assert s.stub.Tokenize(pb.TokenizeRequest(text="a" * 90000)).token_ids
    finally:
        assert s.stop() == 0


def test_health_and_info_answer_while_large_inputs_are_tokenized(server):
    # Tokenizing runs on request workers, never on gRPC's threads, and is near-linear in the input.
    health = health_pb2_grpc.HealthStub(server.channel)
    text = "a" * (1 << 20)
    calls = [server.stub.Tokenize.future(pb.TokenizeRequest(text=text)) for _ in range(6)]
    slowest = 0.0
    while not all(c.done() for c in calls):
        t0 = time.monotonic()
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        server.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
        slowest = max(slowest, time.monotonic() - t0)
    assert all(len(c.result().token_ids) > 0 for c in calls)
    assert slowest < 0.5, f"health + info took {slowest:.3f} s under tokenizing load"
