"""Start-up, health, reflection, bad configs and models, graceful drain."""
import os
import signal
import subprocess
import tempfile
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from conftest import INFERD_BIN, MODELS, SOURCE_DIR, Server, inferd_pb2 as pb


def test_health_serving_and_reflection_lists_the_service(server):
    health = health_pb2_grpc.HealthStub(server.channel)
    assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(server.channel)
    responses = list(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
    names = {s.name for s in responses[0].list_services_response.service}
    assert "inferd.v1.Inference" in names and "grpc.health.v1.Health" in names


def run_inferd(config_text):
    fd, path = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(config_text)
    return subprocess.run([INFERD_BIN, "--config", path, "--listen", "127.0.0.1:0", "--metrics-listen", ""],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("config, rc, message", [
    ("model: {path: /m}\nengine: {blocksize: 4}\n", 2, "engine.blocksize"),
    ("model: {path: /m}\nscheduler: {max_num_seqs: 0}\n", 2, "scheduler.max_num_seqs = 0"),
    ("model: {path: /nonexistent/model}\n", 1, "/nonexistent/model"),
    (f"model: {{path: {MODELS}/llama3-tiny}}\nengine: {{backend: cuda}}\n", 1, "engine.backend"),
    # Config values that only the model or the machine can refuse are config errors too: exit 2.
    (f"model: {{path: {MODELS}/llama3-tiny, max_model_len: 100000}}\n", 2, "model.max_model_len = 100000"),
    (f"model: {{path: {MODELS}/llama3-tiny}}\nengine: {{num_blocks: 16777216}}\n", 2, "engine.num_blocks = 16777216"),
    (f"model: {{path: {MODELS}/llama3-tiny}}\nengine: {{cpu_kv_cache_gib: 1024}}\n", 2, "engine.cpu_kv_cache_gib = 1024"),
    ("model: {path: /m}\nmodel: {path: /n}\n", 2, "section 'model' is given twice"),
    ("model: {path: /m, path: /n}\n", 2, "model.path is given twice"),
])
def test_bad_config_or_model_stops_with_a_message(config, rc, message):
    r = run_inferd(config)
    assert r.returncode == rc, r.stderr
    assert message in r.stderr


def test_a_port_out_of_range_is_a_config_error():
    fd, path = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(f"model: {{path: {MODELS}/llama3-tiny}}\n")
    r = subprocess.run([INFERD_BIN, "--config", path, "--listen", "127.0.0.1:99999"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    assert "PORT in 0..65535" in r.stderr


def test_unsupported_or_truncated_model_is_refused_at_start(tmp_path):
    import json
    import shutil
    bad_arch = tmp_path / "bad-arch"
    shutil.copytree(os.path.join(MODELS, "llama2-tiny"), bad_arch)
    cfg = json.loads((bad_arch / "config.json").read_text())
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    (bad_arch / "config.json").write_text(json.dumps(cfg))
    r = run_inferd(f"model: {{path: {bad_arch}}}\n")
    assert r.returncode == 1 and "GPTNeoXForCausalLM" in r.stderr

    truncated = tmp_path / "truncated"
    shutil.copytree(os.path.join(MODELS, "llama2-tiny"), truncated)
    w = truncated / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-4096])
    r = run_inferd(f"model: {{path: {truncated}}}\n")
    assert r.returncode == 1 and "truncated" in r.stderr


def test_drain_finishes_running_requests_refuses_new_ones_and_exits_zero():
    s = Server(server={"listen": "127.0.0.1:1", "drain_timeout_s": 20})
    req = pb.GenerateRequest(text="Hello", sampling=pb.SamplingParams(temperature=0),
                             stopping=pb.StoppingParams(max_tokens=400, ignore_eos=True))
    stream = s.stub.GenerateStream(req)
    first = next(stream)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    with pytest.raises(grpc.RpcError) as e:
        s.stub.Generate(req, timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    rest = list(stream)
    assert sum(len(c.token_ids) for c in [first] + rest) == 400
    assert rest[-1].finish_reason == pb.LENGTH
    assert s.proc.wait(timeout=30) == 0, s.logs()


def test_requests_still_running_when_the_drain_ends_get_unavailable_and_the_process_exits_zero():
    # The bundled SmolLM2 on the cpu: a 400-token stream takes far longer than a 1 s drain.
    model = os.path.join(SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    s = Server(model=model, engine={"backend": "cpu", "cpu_kv_cache_gib": 0.25},
               server={"listen": "127.0.0.1:1", "drain_timeout_s": 1})
    req = pb.GenerateRequest(text="Tell me a long story.", sampling=pb.SamplingParams(temperature=0),
                             stopping=pb.StoppingParams(max_tokens=400, ignore_eos=True))
    stream = s.stub.GenerateStream(req)
    got = len(next(stream).token_ids)
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    with pytest.raises(grpc.RpcError) as e:
        for chunk in stream:
            got += len(chunk.token_ids)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "shutting down" in e.value.details()
    assert 0 < got < 400, "the stream was cut by the drain's end, after some tokens"
    assert s.proc.wait(timeout=30) == 0, s.logs()
    assert time.monotonic() - t0 < 10, "the process exits soon after the drain timeout"


CORPUS = os.path.join(os.path.dirname(__file__), "..", "fuzz", "corpus", "gguf")


@pytest.mark.parametrize("case, message", [
    ("dims_overflow", "overflow"),
    ("string_length_2_63", "string length"),
    ("string_past_eof", "runs past the end of the file"),
    ("array_2_63", "cannot fit"),
    ("type_mismatch", "'llama.block_count' is a string, not an integer"),
    ("offset_out_of_range", "outside the data section"),
    ("overlapping", "overlap"),
    ("misaligned", "alignment"),
])
def test_malformed_gguf_exits_non_zero_naming_the_problem(case, message):
    r = run_inferd(f"model: {{path: {CORPUS}/{case}.gguf}}\n")
    assert r.returncode == 1, r.stderr
    assert message in r.stderr and f"{case}.gguf" in r.stderr


def test_truncated_gguf_is_refused(tmp_path):
    data = open(os.path.join(MODELS, "qwen2-tiny.gguf"), "rb").read()
    for cut in (len(data) - 1000, 20000, 100):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(data[:cut])
        r = run_inferd(f"model: {{path: {p}}}\n")
        assert r.returncode == 1 and "gguf:" in r.stderr, r.stderr


def test_missing_model_file_names_the_command_that_fetches_it():
    r = run_inferd("model: {path: models/absent.gguf}\n")
    assert r.returncode == 1
    assert "scripts/setup.sh" in r.stderr


@pytest.mark.parametrize("case, message", [
    ("overlapping", "overlap"),
    ("huge_header_length", "header length"),
    ("dim_overflow", "overflow"),
    ("not_json", "not a JSON object"),
])
def test_malformed_safetensors_exits_non_zero_naming_the_problem(tmp_path, case, message):
    import shutil
    d = tmp_path / case
    shutil.copytree(os.path.join(MODELS, "llama2-tiny"), d)
    shutil.copy(os.path.join(os.path.dirname(CORPUS), "safetensors", f"{case}.safetensors"), d / "model.safetensors")
    r = run_inferd(f"model: {{path: {d}}}\n")
    assert r.returncode == 1, r.stderr
    assert message in r.stderr and "model.safetensors" in r.stderr


def test_idle_server_with_open_watches_and_connections_exits_at_once():
    import socket
    s = Server()
    watch = health_pb2_grpc.HealthStub(s.channel).Watch(health_pb2.HealthCheckRequest())
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    sock = socket.create_connection(("127.0.0.1", s.port))  # a client that connected and said nothing
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=10) == 0
    assert time.monotonic() - t0 < 1.0, "nothing was running: the exit is immediate"
    sock.close()


def test_a_second_signal_during_the_drain_exits_at_once_with_a_log_line():
    # The bundled SmolLM2 on the cpu backend: 400 tokens take far longer than this test waits.
    s = Server(model=os.path.join(SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"), engine={"cpu_kv_cache_gib": 0.25}, server={"drain_timeout_s": 60})
    stream = s.stub.GenerateStream(pb.GenerateRequest(
        text="Hello", sampling=pb.SamplingParams(temperature=0),
        stopping=pb.StoppingParams(max_tokens=400, ignore_eos=True)))
    next(stream)  # running: the drain would wait for it
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert s.proc.poll() is None, "still draining"
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGINT)
    assert s.proc.wait(timeout=10) == 128 + signal.SIGINT
    assert time.monotonic() - t0 < 1.0
    assert "again: exiting now" in s.logs()
