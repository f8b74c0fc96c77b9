"""HTTP/1.1 as RFC 9112 asks, against hostile bytes: bounded JSON nesting (the crash that needed no key), short error
quotes, pipelining answered in order, framing that could smuggle refused and the connection closed, trailing bytes,
HEAD, Expect, Host, the absolute form, content types, repeated headers (HTTP and gRPC), the metrics port under slow
clients, and queue seats of cancelled gRPC calls. Each test checks the behaviour; the module checks that threads,
descriptors, KV blocks and queue seats are back to where they started."""
import json
import os
import select
import socket
import tempfile
import threading
import time

import grpc
import pytest

from conftest import Prober, Server, inferd_pb2 as pb
from conftest import harness

KEY = "sk-conformance-0123456789"
AUTH = f"Authorization: Bearer {KEY}\r\n"
JSON_HEAD = "Content-Type: application/json\r\n"
AS_KEYED = (("authorization", f"Bearer {KEY}"),)


def proc_count(pid, what):
    if what == "fds":
        return len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("Threads:")))


@pytest.fixture(scope="module")
def server():
    metrics_port = harness.free_port()
    s = Server(model="llama3-tiny", http=True,
               scheduler={"max_num_seqs": 2, "max_num_batched_tokens": 256, "max_queue": 40},
               server={"http_request_timeout_s": 2, "metrics_listen": f"127.0.0.1:{metrics_port}"})
    s.metrics_port = metrics_port
    s.auth = ()
    s.prober = Prober(s)
    # The baseline after a warm-up: gRPC's executor and the request workers start threads as load first comes (a few,
    # once), which is not what a leak looks like.
    long = pb.GenerateRequest(text="warm", stopping=pb.StoppingParams(max_tokens=100, ignore_eos=True))
    warm = [s.stub.GenerateStream(long) for _ in range(42)]
    for w in warm[:2]:
        next(w)
    for w in warm:
        w.cancel()
    for _ in range(4):
        one(s, post("/v1/completions", COMPLETION))
    time.sleep(1)
    s.baseline = {k: proc_count(s.proc.pid, k) for k in ("fds", "threads")}
    yield s
    # Resources back to their baseline once the battery is over. gRPC's executor may still hold a few pollers its
    # last burst started (their number depends on timing, not on how many requests came); a leak grows with the
    # battery's ~90 connections and requests.
    slack = {"fds": 2, "threads": 4}
    deadline = time.time() + 10
    while time.time() < deadline and any(proc_count(s.proc.pid, k) > s.baseline[k] + slack[k] for k in slack):
        time.sleep(0.1)
    for k in slack:
        assert proc_count(s.proc.pid, k) <= s.baseline[k] + slack[k], (k, s.baseline, proc_count(s.proc.pid, k))
    s.prober.close()
    assert not s.prober.failures, s.prober.failures[:5]
    assert s.stop() == 0, s.logs()


class Conn:
    """A raw connection that reads responses one at a time (Content-Length, chunked, or up to the close)."""

    def __init__(self, port, timeout=30):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data):
        self.sock.sendall(data if isinstance(data, bytes) else data.encode())

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError
        self.buf += chunk

    def _until(self, sep):
        while sep not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(sep, 1)
        return line

    def _take(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response(self, head_only=False):
        """(status, headers with lower-case names, body)."""
        lines = self._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if head_only or status in (100, 204, 304):
            return status, headers, b""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self._until(b"\r\n").split(b";")[0], 16)
                if size == 0:
                    self._until(b"\r\n")
                    return status, headers, body
                body += self._take(size)
                self._take(2)
        if "content-length" in headers:
            return status, headers, self._take(int(headers["content-length"]))
        body = self.buf
        try:
            while True:
                self._fill()
        except (EOFError, ConnectionResetError):
            pass
        return status, headers, body + self.buf[len(body):]

    def closed(self):
        """True once the server has closed (EOF or reset) with nothing more to read."""
        try:
            self._fill()
            return False
        except (EOFError, ConnectionResetError):
            return True

    def close(self):
        self.sock.close()


def post(path, body, head=JSON_HEAD):
    body = body if isinstance(body, bytes) else body.encode()
    return f"POST {path} HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def get(path, head=""):
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode()


def one(server, raw):
    c = Conn(server.http_port)
    c.send(raw)
    try:
        return c.response()
    finally:
        c.close()


COMPLETION = json.dumps({"prompt": "hi", "max_tokens": 2})
DEPTH = 100_000


@pytest.mark.parametrize("where", ["body", "messages", "prompt", "max_tokens", "content"])
def test_json_nested_a_hundred_thousand_deep_is_a_400_not_a_crash(server, where):
    deep = "[" * DEPTH + "]" * DEPTH
    body = {"body": deep,
            "messages": '{"messages": ' + deep + "}",
            "prompt": '{"prompt": ' + deep + "}",
            "max_tokens": '{"prompt": "a", "max_tokens": ' + deep + "}",
            "content": '{"messages": [{"role": "user", "content": ' + deep + "}]}"}[where]
    path = "/v1/chat/completions" if where in ("messages", "content") else "/v1/completions"
    status, _, answer = one(server, post(path, body))
    assert status == 400, answer[:200]
    assert b"nested deeper than" in answer and len(answer) < 1024
    assert server.proc.poll() is None
    assert one(server, post("/v1/completions", COMPLETION))[0] == 200


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize", "/v1/chat/completions/render", "/v1/completions/render"])
def test_the_routers_routes_refuse_hostile_bodies(server, path):
    """The routes the scale-out routers call take the generate routes' bounds: nesting, a form body, the wrong
    method, token ids out of range, a deep tool-call history; the server answers the next request."""
    deep = "[" * DEPTH + "]" * DEPTH
    status, _, answer = one(server, post(path, '{"prompt": ' + deep + ', "tokens": ' + deep + "}"))
    assert status == 400 and b"nested deeper than" in answer and len(answer) < 1024, answer[:200]
    assert one(server, post(path, "prompt=a", head="Content-Type: application/x-www-form-urlencoded\r\n"))[0] == 415
    status, head, _ = one(server, get(path))
    assert status == 405 and head["allow"] == "POST"
    bad = {"/detokenize": '{"tokens": [1, 99999999999]}'}.get(path, '{"prompt": "a", "max_tokens": -1}')
    status, _, answer = one(server, post(path, bad))
    assert status == 400 and len(answer) < 1024, answer[:200]
    if path != "/detokenize":
        history = json.dumps({"messages": [
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
                "name": "f", "arguments": deep}}]}, {"role": "tool", "tool_call_id": "c", "content": "1"},
            {"role": "user", "content": "hi"}]})
        assert one(server, post(path, history))[0] in (200, 400)
    assert server.proc.poll() is None
    assert one(server, post("/v1/completions", COMPLETION))[0] == 200


def test_error_messages_quote_only_a_short_prefix_of_a_value(server):
    for body, status in [(json.dumps({"model": "m" * 500_000, "prompt": "a"}), 404),
                         (json.dumps({"prompt": "a", "x" * 300_000: 1, "max_tokens": "m" * 300_000}), 400),
                         (json.dumps({"prompt": "a", "temperature": "t" * 300_000}), 400),
                         (json.dumps({"prompt": "a", "logit_bias": {"k" * 300_000: 1}}), 400)]:
        got, _, answer = one(server, post("/v1/completions", body))
        assert got == status and len(answer) < 1024, (got, len(answer), answer[:200])
        assert json.loads(answer)["error"]["code"] == status
    # An unknown field is ignored, and the header naming it holds a short prefix of its name.
    got, head, _ = one(server, post("/v1/completions", json.dumps({"prompt": "a", "max_tokens": 1, "x" * 300_000: 1})))
    assert got == 200 and 0 < len(head["x-inferd-ignored-fields"]) < 100, head
    got, _, answer = one(server, get("/" + "p" * 10_000))
    assert got == 404 and len(answer) < 1024


def test_pipelined_requests_are_all_answered_in_order(server):
    c = Conn(server.http_port)
    c.send(get("/health") + post("/v1/completions", COMPLETION) + get("/v1/models") +
           post("/v1/completions", json.dumps({"prompt": "second", "max_tokens": 3})) + get("/nope"))
    answers = [c.response() for _ in range(5)]
    assert [a[0] for a in answers] == [200, 200, 200, 200, 404]
    assert json.loads(answers[1][2])["usage"]["completion_tokens"] == 2
    assert json.loads(answers[2][2])["object"] == "list"
    assert json.loads(answers[3][2])["usage"]["completion_tokens"] == 3
    # Still open for more.
    c.send(get("/health"))
    assert c.response()[0] == 200
    c.close()


def test_pipelined_requests_arriving_while_a_stream_is_written_wait_their_turn(server):
    c = Conn(server.http_port)
    stream = json.dumps({"prompt": "story", "max_tokens": 20, "ignore_eos": True, "stream": True})
    c.send(post("/v1/completions", stream))
    time.sleep(0.05)
    c.send(get("/health") + get("/v1/models"))
    first = c.response()
    assert first[0] == 200 and first[2].rstrip().endswith(b"data: [DONE]")
    assert [c.response()[0] for _ in range(2)] == [200, 200]
    c.close()


@pytest.mark.parametrize("framing, status", [
    ("Transfer-Encoding: gzip\r\nContent-Length: 2\r\n", 400),
    ("Transfer-Encoding: identity\r\nContent-Length: 2\r\n", 400),
    ("Transfer-Encoding: chunked\r\nContent-Length: 2\r\n", 400),
    ("Transfer-Encoding: gzip\r\n", 400),
    ("Transfer-Encoding: gzip, chunked\r\n", 501),
    ("Content-Length: 2\r\nContent-Length: 2\r\n", 400),
    ("Content-Length: 2\r\nContent-Length: 3\r\n", 400),
    ("Content-Length: +2\r\n", 400),
    ("Content-Length: 2, 2\r\n", 400),
])
def test_ambiguous_framing_is_refused_and_the_connection_closed(server, framing, status):
    c = Conn(server.http_port)
    # A smuggled second request hides behind the first's body: it must never be answered.
    c.send(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{JSON_HEAD}{framing}\r\n{{}}".encode() +
           get("/v1/models"))
    got, headers, body = c.response()
    assert got == status, body[:200]
    assert headers.get("connection", "").lower() == "close"
    assert c.closed(), "the connection stays open after a framing error"
    c.close()


def test_a_chunked_body_with_bare_lf_line_endings_gets_an_answer(server):
    body = COMPLETION.encode()
    c = Conn(server.http_port)
    c.send(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{JSON_HEAD}Transfer-Encoding: chunked\r\n\r\n".encode() +
           b"%x\n" % len(body) + body + b"\n0\n\n")
    got, _, answer = c.response()
    assert got == 400, answer[:200]
    c.close()


@pytest.mark.parametrize("tail, status", [(b"\x00garbage", 400), (b"x", 400), (b"{}", 400), (b" \r\n\t ", 200)])
def test_bytes_after_the_json_value_are_refused_unless_whitespace(server, tail, status):
    got, _, answer = one(server, post("/v1/completions", COMPLETION.encode() + tail))
    assert got == status, answer[:200]


def test_head_gets_the_head_of_get_without_a_body(server):
    for path in ("/health", "/v1/models"):
        _, get_headers, get_body = one(server, get(path))
        c = Conn(server.http_port)
        c.send(f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode() + get("/health"))
        status, headers, _ = c.response(head_only=True)
        assert status == 200 and int(headers["content-length"]) == len(get_body)
        # The next response follows at once: nothing of a body came in between.
        assert c.response()[0] == 200 and c.buf == b""
        c.close()


def test_expect_100_continue_gets_100_before_the_body_is_sent(server):
    body = COMPLETION.encode()
    c = Conn(server.http_port)
    c.send(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{JSON_HEAD}Expect: 100-continue\r\n"
           f"Content-Length: {len(body)}\r\n\r\n".encode())
    assert c.response()[0] == 100
    c.send(body)
    assert c.response()[0] == 200
    c.close()
    assert one(server, f"GET /health HTTP/1.1\r\nHost: x\r\nExpect: something-else\r\n\r\n".encode())[0] == 417


def test_host_must_be_sent_exactly_once_in_http_1_1(server):
    assert one(server, b"GET /health HTTP/1.1\r\n\r\n")[0] == 400
    assert one(server, b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")[0] == 400
    assert one(server, b"GET /health HTTP/1.0\r\n\r\n")[0] == 200


def test_the_absolute_form_is_served_as_its_path(server):
    status, _, body = one(server, f"GET http://127.0.0.1:{server.http_port}/v1/models HTTP/1.1\r\nHost: x\r\n"
                                  "\r\n".encode())
    assert status == 200 and json.loads(body)["object"] == "list"
    assert one(server, b"GET * HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 405
    assert one(server, b"GET ftp://x/health HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 400


def test_405_says_405_and_what_is_allowed(server):
    status, headers, body = one(server, post("/v1/models", "{}"))
    assert status == 405 and headers["allow"] == "GET, HEAD"
    assert json.loads(body)["error"]["code"] == 405
    status, headers, body = one(server, get("/v1/completions"))
    assert status == 405 and headers["allow"] == "POST" and json.loads(body)["error"]["code"] == 405


@pytest.mark.parametrize("content_type, status", [
    (None, 415), ("text/plain", 415), ("application/x-www-form-urlencoded", 415),
    ("multipart/form-data; boundary=x", 415), ("application/json; charset=latin-1", 415),
    ("application/json", 200), ("application/json; charset=utf-8", 200), ("Application/JSON;charset=\"UTF-8\"", 200),
])
def test_generate_routes_take_only_json_bodies(server, content_type, status):
    head = f"Content-Type: {content_type}\r\n" if content_type else ""
    got, _, answer = one(server, post("/v1/completions", COMPLETION, head=head))
    assert got == status, answer[:200]


def test_two_authorization_headers_are_refused_on_http_and_grpc():
    fd, keys = tempfile.mkstemp(prefix="inferd-keys-")
    with os.fdopen(fd, "w") as f:
        f.write(KEY + "\n")
    keyed = Server(model="llama3-tiny", http=True, server={"api_keys_file": keys})
    try:
        two = AUTH + AUTH.replace(KEY, "sk-other")
        for head in (two, AUTH + AUTH):
            status, _, answer = one(keyed, post("/v1/completions", COMPLETION, head=JSON_HEAD + head))
            assert status == 400 and b"more than once" in answer, answer[:200]
        assert one(keyed, post("/v1/completions", COMPLETION, head=JSON_HEAD + AUTH))[0] == 200
        request = pb.GenerateRequest(text="hi", stopping=pb.StoppingParams(max_tokens=2))
        for metadata in (AS_KEYED + (("authorization", "Bearer sk-other"),),
                         (("authorization", "Bearer sk-other"),) + AS_KEYED, AS_KEYED + AS_KEYED):
            with pytest.raises(grpc.RpcError) as e:
                keyed.stub.Generate(request, metadata=metadata, timeout=30)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "more than once" in e.value.details()
        assert keyed.stub.Generate(request, metadata=AS_KEYED, timeout=30).usage.completion_tokens == 2
    finally:
        assert keyed.stop() == 0, keyed.logs()


def test_slow_clients_on_the_metrics_port_do_not_starve_scrapes(server):
    stop = threading.Event()
    slow = [socket.create_connection(("127.0.0.1", server.metrics_port)) for _ in range(12)]

    def drip():  # a head, one byte at a time, for as long as the test goes on
        i = 0
        while not stop.is_set():
            for s in slow:
                try:
                    s.send(b"GET /metrics HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"[i % 40:i % 40 + 1])
                except OSError:
                    pass
            i += 1
            stop.wait(0.5)
    t = threading.Thread(target=drip)
    t.start()
    try:
        for _ in range(5):  # scrapes answer while the drip goes on, across the head timeout (2 s here)
            c = Conn(server.metrics_port)
            c.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, body = c.response()
            c.close()
            assert status == 200 and b"inferd_" in body
            time.sleep(0.6)
        # The dripping clients were closed by the head timeout.
        for s in slow:
            s.settimeout(10)
            try:
                while s.recv(4096):
                    pass
            except (ConnectionResetError, socket.timeout):
                pass
    finally:
        stop.set()
        t.join()
        for s in slow:
            s.close()
    # The port bounds how many connections it keeps open at once; the rest are closed as they come, long before the
    # head timeout (2 s here) would close them.
    many = [socket.create_connection(("127.0.0.1", server.metrics_port)) for _ in range(100)]
    time.sleep(1.0)
    closed, _, _ = select.select(many, [], [], 0)
    for s in many:
        s.close()
    assert len(closed) >= 100 - 64, len(closed)


def test_cancelled_grpc_calls_give_their_queue_seats_back(server):
    # Two long requests take both sequences; forty more fill the queue (scheduler.max_queue = 40 here).
    long = pb.GenerateRequest(text="long", sampling=pb.SamplingParams(temperature=0),
                              stopping=pb.StoppingParams(max_tokens=300, ignore_eos=True))
    running = [server.stub.GenerateStream(long, metadata=server.auth) for _ in range(2)]
    for r in running:
        next(r)
    queued = [server.stub.GenerateStream(long, metadata=server.auth) for _ in range(40)]
    deadline = time.time() + 30
    while server.stub.GetServerInfo(pb.GetServerInfoRequest(), metadata=server.auth).waiting_requests < 40:
        assert time.time() < deadline, "the queue did not fill"
        time.sleep(0.02)
    with pytest.raises(grpc.RpcError) as e:
        server.stub.Generate(long, metadata=server.auth, timeout=30)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for q in queued:
        q.cancel()
    # New requests are taken again (each cancel frees its seat when the server sees it).
    short = pb.GenerateRequest(text="x", stopping=pb.StoppingParams(max_tokens=1))
    refused = 0
    deadline = time.time() + 30
    while True:
        try:
            server.stub.Generate(short, metadata=server.auth, timeout=60)
            break
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.time() < deadline, err
            refused += 1
            time.sleep(0.01)
    for r in running:
        r.cancel()
    print(f"refused {refused} times after the cancels")


def test_a_call_with_too_much_metadata_is_refused_alone(server):
    """100 KB of metadata: that call is RESOURCE_EXHAUSTED; a stream running on the same channel goes on."""
    long = pb.GenerateRequest(text="long", sampling=pb.SamplingParams(temperature=0),
                              stopping=pb.StoppingParams(max_tokens=100, ignore_eos=True))
    stream = server.stub.GenerateStream(long)
    got = len(next(stream).token_ids)
    for size in (20 << 10, 100 << 10):
        with pytest.raises(grpc.RpcError) as e:
            server.stub.Generate(pb.GenerateRequest(text="x", stopping=pb.StoppingParams(max_tokens=1)),
                                 metadata=(("x-big", "a" * size),), timeout=30)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "metadata" in e.value.details()
    got += sum(len(c.token_ids) for c in stream)
    assert got == 100
    # 8 KiB (gRPC's usual limit) and less is served as before.
    r = server.stub.Generate(pb.GenerateRequest(text="x", stopping=pb.StoppingParams(max_tokens=1)),
                             metadata=(("x-some", "a" * (8 << 10)),), timeout=30)
    assert r.usage.completion_tokens == 1


@pytest.mark.parametrize("raw, status", [
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + JSON_HEAD.encode() + b"Content-Length : 2\r\n\r\n{}", 400),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + JSON_HEAD.encode() + b"Content-Length: -1\r\n\r\n{}", 400),
    (b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", 400),
    (b"GET /health HTTP/1.1\nHost: x\n\n", 400),
    (b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 400),
    # RFC 9112 §5.2 lets a server replace an obs-fold with spaces rather than refuse it: the header stays one field.
    (b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n", 200),
])
def test_malformed_field_lines_and_versions(server, raw, status):
    got, _, answer = one(server, raw)
    assert got == status, answer[:200]
