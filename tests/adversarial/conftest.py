"""The adversarial battery's server and its health prober (the real inferd binary, Python grpcio clients)."""
import importlib.util
import os
import threading
import time

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

# The integration suite's server harness, loaded under its own name (both folders have a conftest.py).
_spec = importlib.util.spec_from_file_location(
    "inferd_integration_harness", os.path.join(os.path.dirname(__file__), "..", "integration", "conftest.py"))
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)
Server, inferd_pb2 = harness.Server, harness.inferd_pb2

class Prober:
    """Asks health and GetServerInfo every 20 ms from its own channel; counts the answers, keeps the slowest (printed,
    never asserted: how fast is for benchmarks; that they answer, SERVING, while the battery runs is the test)."""

    def __init__(self, server):
        import grpc
        self.channel = grpc.insecure_channel(server.address)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.stub = server.stub.__class__(self.channel)
        self.slowest, self.where, self.failures, self.answers = 0.0, "", [], 0
        self.current = "start"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                assert self.health.Check(health_pb2.HealthCheckRequest(), timeout=60).status == \
                    health_pb2.HealthCheckResponse.SERVING
                self.stub.GetServerInfo(inferd_pb2.GetServerInfoRequest(), timeout=60)
                self.answers += 1
            except Exception as e:  # noqa: BLE001 - reported by the tests
                self.failures.append(f"{self.current}: {e!r}")
            took = time.monotonic() - t0
            if took > self.slowest:
                self.slowest, self.where = took, self.current
            time.sleep(0.02)

    def answered_since(self, count, timeout=120):
        """Waits for an answer after the count-th: health and GetServerInfo still answer."""
        deadline = time.monotonic() + timeout
        while self.answers <= count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.answers > count

    def close(self):
        self.stop.set()
        self.thread.join()
        self.channel.close()


@pytest.fixture(scope="module")
def server():
    s = Server(model="llama3-tiny", scheduler={"max_num_seqs": 16, "max_num_batched_tokens": 512, "max_queue": 32})
    s.prober = Prober(s)
    yield s
    s.prober.close()
    assert s.stop() == 0, s.logs()


@pytest.fixture(autouse=True)
def settled(server, request):
    """Around every test: health keeps answering SERVING, and afterwards nothing runs and every KV block is free."""
    server.prober.current = request.node.name
    answers = server.prober.answers
    yield
    deadline = time.time() + 10
    while True:
        info = server.stub.GetServerInfo(inferd_pb2.GetServerInfoRequest())
        if (info.running_requests == 0 and info.waiting_requests == 0 and
                info.free_kv_blocks == info.total_kv_blocks) or time.time() > deadline:
            break
        time.sleep(0.05)
    assert info.running_requests == 0 and info.waiting_requests == 0, info
    assert info.free_kv_blocks == info.total_kv_blocks, info
    assert not server.prober.failures, server.prober.failures
    assert server.prober.answered_since(answers), f"health stopped answering during {request.node.name}"
    print(f"slowest health + GetServerInfo so far: {server.prober.slowest:.3f} s ({server.prober.where})")
