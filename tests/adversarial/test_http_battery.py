"""The adversarial battery over HTTP: garbage bodies, huge bodies, slow-loris heads and bodies, clients that vanish
mid-stream, and 1,000 concurrent streaming connections — health and other clients stay responsive, and nothing
leaks: KV blocks, threads, file descriptors."""
import json
import os
import random
import resource
import selectors
import socket
import threading
import time

import pytest

from conftest import Prober, Server, inferd_pb2 as pb

CONNECTIONS = 1000


@pytest.fixture(scope="module")
def server():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 3 * CONNECTIONS:
        pytest.skip(f"{CONNECTIONS} connections need {3 * CONNECTIONS} file descriptors; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 3 * CONNECTIONS), hard))  # inferd inherits it
    s = Server(model="llama3-tiny", http=True,
               scheduler={"max_num_seqs": 64, "max_num_batched_tokens": 512, "max_queue": 4 * CONNECTIONS},
               server={"http_request_timeout_s": 2})
    s.prober = Prober(s)
    s.host, s.hport = "127.0.0.1", s.http_port
    yield s
    s.prober.close()
    assert not s.prober.failures, s.prober.failures[:5]
    assert s.prober.answers > 0
    assert s.stop() == 0, s.logs()


def proc_status(pid, key):
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith(key + ":")))


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def request(path, body, extra=b""):
    body = body if isinstance(body, bytes) else body.encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            .encode() + extra + b"\r\n" + body)


def exchange(server, raw, timeout=30):
    """Sends raw bytes, reads to the end of the response (the server closes or the body is complete)."""
    s = socket.create_connection((server.host, server.hport), timeout=timeout)
    s.sendall(raw)
    data = b""
    while True:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep and b"content-length:" in head.lower():
            n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            if len(rest) >= n:
                break
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    return data


def status_of(response):
    return int(response.split(b" ", 2)[1])


def idle(server, timeout=5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        info = server.stub.GetServerInfo(pb.GetServerInfoRequest())
        if info.running_requests == 0 and info.waiting_requests == 0 and info.free_kv_blocks == info.total_kv_blocks:
            return True
        time.sleep(0.05)
    return False


def test_random_bodies_are_answered_4xx_never_5xx(server):
    server.prober.current = "random bodies"
    rng = random.Random(7)
    for i in range(200):
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))
        if i % 3 == 0:  # JSON with wrong types in known fields
            body = json.dumps({rng.choice(["messages", "prompt", "n", "max_tokens", "temperature", "stop", "stream",
                                           "logprobs", "seed", "top_k"]): rng.choice([None, -1, 1e308, "x", [], {},
                                                                                     [1, "a"], True])}).encode()
        path = rng.choice(["/v1/chat/completions", "/v1/completions"])
        got = status_of(exchange(server, request(path, body)))
        assert 400 <= got < 500, (path, body[:80], got)


def test_bodies_over_the_limit_are_413_before_they_are_read(server):
    server.prober.current = "huge bodies"
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000000\r\n\r\n")
    assert status_of(exchange(server, head + b"{")) == 413
    chunked = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
               (b"100000\r\n" + b"x" * 0x100000 + b"\r\n") * 5 + b"0\r\n\r\n")
    assert status_of(exchange(server, chunked)) == 413
    assert status_of(exchange(server, b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")) == 431


def test_slow_loris_heads_and_bodies_are_closed_and_hold_nobody_back(server):
    server.prober.current = "slow loris"
    slow = []
    for i in range(100):
        s = socket.create_connection((server.host, server.hport))
        if i % 2:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # a head that never ends
        else:
            s.sendall(request("/v1/completions", b'{"prompt": "hi", "max_tokens": 2}')[:-10])  # a body cut short
        slow.append(s)
    # Everyone else is served meanwhile.
    t0 = time.time()
    ok = exchange(server, request("/v1/completions", '{"prompt": "hello", "max_tokens": 2}'))
    assert status_of(ok) == 200 and time.time() - t0 < 5
    # After server.http_request_timeout_s (2 s here) the slow ones are closed.
    time.sleep(3)
    for s in slow:
        s.settimeout(5)
        try:
            assert s.recv(100) == b""
        except ConnectionResetError:
            pass
        s.close()


def test_a_kept_alive_connection_closes_once_idle_after_its_answer(server):
    server.prober.current = "idle after an answer"
    for stream in (False, True):
        s = socket.create_connection((server.host, server.hport), timeout=10)
        s.sendall(request("/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2, "stream": stream})))
        got = b""
        while not (got.endswith(b"0\r\n\r\n") if stream else b'"usage"' in got and got.endswith(b"}")):
            got += s.recv(65536)
        assert got.startswith(b"HTTP/1.1 200"), got[:100]
        t0 = time.time()
        assert s.recv(100) == b"", "closed, with nothing more sent"
        assert 1.5 < time.time() - t0 < 6  # server.http_request_timeout_s is 2 s here
        s.close()


def test_clients_that_vanish_mid_stream_free_every_block(server):
    server.prober.current = "vanishing clients"
    socks = []
    for i in range(20):
        s = socket.create_connection((server.host, server.hport))
        s.sendall(request("/v1/completions", json.dumps({"prompt": f"story {i}", "max_tokens": 400, "ignore_eos": True,
                                                         "stream": True})))
        socks.append(s)
    for s in socks:
        got = b""
        while got.count(b"data: ") < 2:
            got += s.recv(65536)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset, no FIN
        s.close()
    assert idle(server, timeout=3), server.stub.GetServerInfo(pb.GetServerInfoRequest())


def test_a_thousand_concurrent_streams_on_a_few_threads_leak_nothing(server):
    server.prober.current = f"{CONNECTIONS} streams"
    pid = server.proc.pid
    threads_before, fds_before = proc_status(pid, "Threads"), open_fds(pid)
    peak = [0]
    sampling = threading.Event()

    def sample():  # the server's open descriptors, at their most
        while not sampling.is_set():
            peak[0] = max(peak[0], open_fds(pid))
            time.sleep(0.005)
    sampler = threading.Thread(target=sample)
    sampler.start()
    sel = selectors.DefaultSelector()
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 6, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}})
    conns = {}
    for i in range(CONNECTIONS):
        s = socket.create_connection((server.host, server.hport))
        s.setblocking(False)
        conns[s] = b""
    for s in conns:
        s.setblocking(True)
        s.sendall(request("/v1/completions", body))
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    t0 = time.time()
    done = 0
    while done < CONNECTIONS and time.time() - t0 < 120:
        for key, _ in sel.select(timeout=1):
            s = key.fileobj
            chunk = s.recv(65536)
            conns[s] += chunk
            if not chunk or conns[s].endswith(b"data: [DONE]\r\n\r\n0\r\n\r\n") or b"data: [DONE]" in conns[s]:
                sel.unregister(s)
                done += 1
    seconds = time.time() - t0
    threads_during = proc_status(pid, "Threads")
    sampling.set()
    sampler.join()
    complete = [r for r in conns.values() if b"data: [DONE]" in r and b'"completion_tokens":6' in r]
    for s in conns:
        s.close()
    assert len(complete) == CONNECTIONS, (len(complete), [r[:200] for r in conns.values() if r not in complete][:2])
    assert peak[0] >= fds_before + CONNECTIONS, (fds_before, peak[0])  # all of them open at once
    assert threads_during <= threads_before + 2, (threads_before, threads_during)  # no thread per connection
    print(f"{CONNECTIONS} concurrent SSE streams x 6 tokens in {seconds:.1f} s on {threads_during} threads")
    assert idle(server, timeout=5)
    deadline = time.time() + 5
    while open_fds(pid) > fds_before + 5 and time.time() < deadline:
        time.sleep(0.1)
    assert open_fds(pid) <= fds_before + 5, (fds_before, open_fds(pid))


def test_a_thousand_idle_connections_leave_health_and_other_clients_responsive(server):
    server.prober.current = f"{CONNECTIONS} idle connections"
    pid = server.proc.pid
    fds_before = open_fds(pid)
    idle_conns = [socket.create_connection((server.host, server.hport)) for _ in range(CONNECTIONS)]
    t0 = time.time()
    ok = exchange(server, request("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], '
                                                           '"max_tokens": 3}'))
    assert status_of(ok) == 200 and time.time() - t0 < 5
    for s in idle_conns:
        s.close()
    deadline = time.time() + 5
    while open_fds(pid) > fds_before + 5 and time.time() < deadline:
        time.sleep(0.1)
    assert open_fds(pid) <= fds_before + 5
