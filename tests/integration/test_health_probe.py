"""`inferd health-probe`, the container's health check (no grpcurl in the image): exit 0 while the server serves,
1 and NOT_SERVING once it drains, 1 naming the address when nothing answers, 2 on a bad command line."""
import os
import signal
import subprocess
import threading

from conftest import INFERD_BIN, SOURCE_DIR, Server, free_port, inferd_pb2 as pb


def probe(*args):
    return subprocess.run([INFERD_BIN, "health-probe", *args], capture_output=True, text=True, timeout=30)


def test_serving_then_not_serving_while_draining_then_unreachable():
    # The bundled SmolLM2 on the cpu: slow enough that a 64-token stream is still running while the probe asks.
    model = os.path.join(SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    s = Server(model=model, engine={"backend": "cpu", "cpu_kv_cache_gib": 0.25},
               server={"listen": "127.0.0.1:1", "drain_timeout_s": 120})
    r = probe("--address", s.address)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{s.address}: SERVING"
    req = pb.GenerateRequest(text="Tell me a long story about a lighthouse.", sampling=pb.SamplingParams(temperature=0),
                             stopping=pb.StoppingParams(max_tokens=64, ignore_eos=True))
    stream = s.stub.GenerateStream(req)
    next(stream)
    rest = []
    reader = threading.Thread(target=lambda: rest.extend(stream))
    reader.start()
    s.proc.send_signal(signal.SIGTERM)
    r = probe("--address", s.address)
    reader.join(timeout=300)
    assert r.returncode == 1 and r.stdout.strip() == f"{s.address}: NOT_SERVING", (r.stdout, r.stderr)
    assert rest and rest[-1].finish_reason == pb.LENGTH, "the running stream finished during the drain"
    assert s.proc.wait(timeout=60) == 0, s.logs()
    gone = probe("--address", s.address, "--timeout-s", "1")
    assert gone.returncode == 1 and f"{s.address} did not answer" in gone.stderr, gone.stderr


def test_nothing_listening_and_bad_arguments():
    address = f"127.0.0.1:{free_port()}"
    r = probe("--address", address, "--timeout-s", "0.5")
    assert r.returncode == 1 and f"inferd health-probe: {address} did not answer" in r.stderr, r.stderr
    bad = probe("--timeout-s", "-1")
    assert bad.returncode == 2 and "--timeout-s must be a positive number" in bad.stderr
    assert probe("--frobnicate").returncode == 2
