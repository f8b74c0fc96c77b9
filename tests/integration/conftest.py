"""Starts the real inferd binary on loopback and gives tests real grpcio clients.

The Python stubs are generated from proto/inferd/v1/inferd.proto at session start.
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

SOURCE_DIR = os.environ.get("INFERD_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
INFERD_BIN = os.environ.get("INFERD_BIN", os.path.join(SOURCE_DIR, "build", "server", "inferd"))
MODELS = os.path.join(SOURCE_DIR, "tests", "fixtures", "models")
SMOLLM2 = os.path.join(SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")  # the bundled model


# INFERD_SMOLLM2_BACKEND=cuda serves the SmolLM2 suites (structured output, tools, the schema suite) on the GPU:
# scripts/gpu_run.sh smollm2 runs them there.
SMOLLM2_BACKEND = os.environ.get("INFERD_SMOLLM2_BACKEND", "cpu")


def smollm2_server(**engine):
    """The bundled SmolLM2 served with the OpenAI HTTP API on the cpu backend, or on cuda where
    INFERD_SMOLLM2_BACKEND says so (engine keys added or replaced)."""
    assert os.path.exists(SMOLLM2), "bash scripts/setup.sh fetches the bundled model"
    s = Server(model=SMOLLM2, http=True, engine={"backend": SMOLLM2_BACKEND, "block_size": 16,
                                                 "cpu_kv_cache_gib": 0.25, "gpu_memory_utilization": 0.2, **engine})
    backend = s.stub.GetServerInfo(inferd_pb2.GetServerInfoRequest()).backend
    if backend != SMOLLM2_BACKEND:
        s.stop()
        raise AssertionError(f"asked for the {SMOLLM2_BACKEND} backend, got {backend}")
    return s


def openai_client(server, timeout):
    """The official `openai` SDK against a server's HTTP API, and the id of the model it serves."""
    import openai
    client = openai.OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0, timeout=timeout)
    (m,) = client.models.list().data
    return client, m.id


def _generate_stubs():
    # Where grpcio-tools is missing (the GPU machine), scripts/make_gpu_bundle.sh brings stubs made here.
    if os.environ.get("INFERD_PY_STUBS"):
        sys.path.insert(0, os.environ["INFERD_PY_STUBS"])
        return
    from grpc_tools import protoc
    out = tempfile.mkdtemp(prefix="inferd-stubs-")
    rc = protoc.main(["protoc", f"-I{SOURCE_DIR}/proto", f"--python_out={out}", f"--grpc_python_out={out}",
                      f"{SOURCE_DIR}/proto/inferd/v1/inferd.proto"])
    assert rc == 0, "protoc failed"
    sys.path.insert(0, out)


_generate_stubs()
from inferd.v1 import inferd_pb2, inferd_pb2_grpc  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """http=True also serves the OpenAI-compatible HTTP API on a free port (self.http_url)."""

    def __init__(self, model="llama3-tiny", http=False, grpc_credentials=None, **sections):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.http_port = free_port() if http else None
        tls = "tls_cert_file" in sections.get("server", {})
        self.http_url = f"{'https' if tls else 'http'}://127.0.0.1:{self.http_port}" if http else None
        cfg = {"model": {"path": os.path.join(MODELS, model)},
               "engine": {"backend": "cpu", "block_size": 16, "cpu_kv_cache_gib": 0.05},
               "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": 512, "max_queue": 256},
               "server": {"listen": "127.0.0.1:1", "drain_timeout_s": 10, "metrics_listen": '""'}}
        if http:
            cfg["server"]["http_listen"] = f"127.0.0.1:{self.http_port}"
        for section, values in sections.items():
            cfg.setdefault(section, {}).update(values)
        fd, self.config_path = tempfile.mkstemp(suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            for section, values in cfg.items():
                f.write(f"{section}:\n")
                for k, v in values.items():
                    f.write(f"  {k}: {v}\n")
        self.log = tempfile.NamedTemporaryFile(prefix="inferd-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([INFERD_BIN, "--config", self.config_path, "--listen", self.address],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.channel = (grpc.secure_channel(self.address, grpc_credentials) if grpc_credentials
                        else grpc.insecure_channel(self.address))
        self.stub = inferd_pb2_grpc.InferenceStub(self.channel)
        self.wait_serving()

    def wait_serving(self, timeout=float(os.environ.get("INFERD_START_TIMEOUT_S", "30"))):
        health = health_pb2_grpc.HealthStub(self.channel)
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"inferd exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                if health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.05)
        raise RuntimeError("inferd did not become SERVING:\n" + self.logs())

    def logs(self):
        with open(self.log.name) as f:
            return f.read()

    def stop(self):
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise
        return self.proc.returncode


def cancel_half_of_streams(stub, requests):
    """Consumes one stream per request on its own thread, cancelling every even one after 3 tokens. Returns
    {index: tokens received or "cancelled"} and the unexpected errors."""
    streams = [stub.GenerateStream(r) for r in requests]
    done, errors = {}, []

    def consume(i, s):
        try:
            n = 0
            for chunk in s:
                n += len(chunk.token_ids)
                if i % 2 == 0 and n >= 3:
                    s.cancel()
            done[i] = n
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED or i % 2 == 1:
                errors.append((i, e.code(), e.details()))
            done[i] = "cancelled"

    threads = [threading.Thread(target=consume, args=(i, s)) for i, s in enumerate(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return done, errors


class StreamResult:
    """What one GenerateStream call returned: ids, text, (id, logprob, [(id, logprob) alternatives]) per token, the
    finish reason and the usage's completion tokens."""

    def __init__(self, chunks):
        self.ids = [t for c in chunks for t in c.token_ids]
        self.text = "".join(c.text for c in chunks)
        self.logprobs = [(lp.token_id, lp.logprob, [(t.token_id, t.logprob) for t in lp.top])
                         for c in chunks for lp in c.logprobs]
        self.finish = chunks[-1].finish_reason
        self.completion = chunks[-1].usage.completion_tokens


def stream_all(stub, requests, timeout=300):
    """Runs every request as a GenerateStream at once, one thread each; their StreamResults in order."""
    results, errors = {}, []

    def run(i):
        try:
            results[i] = StreamResult(list(stub.GenerateStream(requests[i], timeout=timeout)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not errors, errors
    assert len(results) == len(requests)
    return [results[i] for i in range(len(requests))]


def wait_until_idle(stub, timeout=5):
    """GetServerInfo once nothing runs and every block is free (or the last answer at the timeout)."""
    deadline = time.time() + timeout
    while True:
        info = stub.GetServerInfo(inferd_pb2.GetServerInfoRequest())
        if (info.running_requests == 0 and info.free_kv_blocks == info.total_kv_blocks) or time.time() > deadline:
            return info
        time.sleep(0.05)



def evict_prefix_to_host_and_ask_again(stub, greedy):
    """A prompt, then other long prompts that take every device block (the first one's cached blocks are evicted
    and written back to the host tier), then the prompt again: (first answer, second answer, stats before the second,
    stats after it). `greedy(text, max_tokens)` makes the requests."""
    prompt = " ".join(f"fact {i} about paged attention" for i in range(12))
    first = stub.Generate(greedy(prompt, max_tokens=8))
    for i in range(6):
        stub.Generate(greedy(" ".join(f"other {i} {j} words" for j in range(15)), max_tokens=4))
    before = wait_until_idle(stub)
    again = stub.Generate(greedy(prompt, max_tokens=8))
    return first, again, before, wait_until_idle(stub)

def assert_half_cancelled_and_every_block_free(stub, done, errors, n, max_tokens):
    """After cancel_half_of_streams over n streams of max_tokens each: every even one was cancelled, every odd one
    ran to its end, and once idle the server holds no request and no KV block."""
    assert not errors, errors
    assert all(done[i] == "cancelled" for i in range(0, n, 2))
    assert all(done[i] == max_tokens for i in range(1, n, 2))
    info = wait_until_idle(stub)
    assert info.running_requests == 0 and info.waiting_requests == 0
    assert info.free_kv_blocks == info.total_kv_blocks > 0


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    assert s.stop() == 0, s.logs()


@pytest.fixture
def pb():
    return inferd_pb2
