"""Observability through the real server: /metrics scraped by a real Prometheus (Debian's `prometheus`, started
on loopback) and checked by `promtool`; health that flips to NOT_SERVING when the engine makes no progress."""
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import SOURCE_DIR, Server, free_port, inferd_pb2 as pb

FAMILIES = [
    "inferd_requests_total", "inferd_request_success_total", "inferd_time_to_first_token_seconds_bucket",
    "inferd_time_per_output_token_seconds_bucket", "inferd_inter_token_latency_seconds_bucket",
    "inferd_e2e_request_latency_seconds_bucket", "inferd_request_queue_time_seconds_bucket",
    "inferd_request_prompt_tokens_bucket", "inferd_request_generation_tokens_bucket", "inferd_num_requests_running",
    "inferd_num_requests_waiting", "inferd_kv_blocks", "inferd_kv_cache_usage_ratio", "inferd_prefix_cache_hit_rate",
    "inferd_preemptions_total", "inferd_step_batch_size_bucket", "inferd_step_tokens_bucket", "inferd_steps_total",
    "inferd_model_bandwidth_utilization_ratio", "inferd_model_flops_utilization_ratio",
    "inferd_step_model_bandwidth_utilization_ratio_bucket", "inferd_step_model_flops_utilization_ratio_bucket",
    "inferd_device_idle_ratio", "inferd_step_device_idle_ratio_bucket", "inferd_model_read_bytes_total",
    "inferd_model_flops_total", "inferd_generation_tokens_total", "inferd_device_read_bandwidth_ceiling_bytes_per_second",
    "inferd_device_gemm_ceiling_flops_per_second",
]


def greedy(text, max_tokens):
    return pb.GenerateRequest(text=text, sampling=pb.SamplingParams(temperature=0),
                              stopping=pb.StoppingParams(max_tokens=max_tokens, ignore_eos=True))


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def sample(text, name, **labels):
    """The value of the sample `name{labels}` in exposition text (labels given must all match)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, value = line.rsplit(" ", 1)
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


def test_metrics_are_exposed_valid_and_scraped_by_a_real_prometheus():
    port = free_port()
    s = Server(server={"metrics_listen": f"127.0.0.1:{port}"})
    prom = None
    try:
        for i in range(6):
            s.stub.Generate(greedy(f"hello {i} " * 3, max_tokens=8))
        try:
            s.stub.Generate(pb.GenerateRequest(text="x", sampling=pb.SamplingParams(temperature=-1)))
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        text = scrape(port)
        for family in FAMILIES:
            assert family in text, family
        assert sample(text, "inferd_requests_total", code="OK") == 6
        assert sample(text, "inferd_requests_total", code="INVALID_ARGUMENT") == 1
        assert sample(text, "inferd_request_success_total", finish_reason="length") == 6
        assert sample(text, "inferd_request_generation_tokens_count") == 6
        assert sample(text, "inferd_request_generation_tokens_sum") == 48
        assert sample(text, "inferd_inter_token_latency_seconds_count") == 6 * 7
        assert sample(text, "inferd_kv_blocks", state="free") > 0
        promtool = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        # vLLM's names (vllm:…, kept for the tools that read them) are the only lint promtool may raise: a colon
        # is reserved for recording rules by convention, not invalid in the exposition format.
        problems = [line for line in (promtool.stdout + promtool.stderr).splitlines()
                    if line.strip() and not re.match(r"^vllm:\w+ metric names should not contain ':'$", line)]
        assert not problems, promtool.stdout + promtool.stderr
        assert sample(text, "vllm:num_requests_waiting", model_name="llama3-tiny") == 0

        # A real Prometheus scrapes it every 0.5 s; its HTTP API must then answer for the families.
        data = tempfile.mkdtemp(prefix="inferd-prom-")
        web = free_port()
        with open(os.path.join(data, "prometheus.yml"), "w") as f:
            f.write("global:\n  scrape_interval: 500ms\nscrape_configs:\n  - job_name: inferd\n"
                    f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
        prom = subprocess.Popen(["prometheus", f"--config.file={data}/prometheus.yml", f"--storage.tsdb.path={data}",
                                 f"--web.listen-address=127.0.0.1:{web}"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

        def query(expr):
            url = f"http://127.0.0.1:{web}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.load(r)["data"]["result"]

        end = time.time() + 60
        while time.time() < end:
            try:
                if query('inferd_requests_total{code="OK"}'):
                    break
            except OSError:
                pass
            time.sleep(0.25)
        assert float(query('inferd_requests_total{code="OK"}')[0]["value"][1]) == 6
        for expr in ["inferd_num_requests_running", 'inferd_kv_blocks{state="used"}',
                     "histogram_quantile(0.5, inferd_time_to_first_token_seconds_bucket)",
                     "inferd_prefix_cache_hit_rate", "inferd_preemptions_total", "inferd_steps_total"]:
            assert query(expr), expr
        # Every query of the Grafana dashboard in docker/ is valid PromQL over these series.
        with open(os.path.join(SOURCE_DIR, "docker", "grafana-dashboard.json")) as f:
            dashboard = json.load(f)
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                query(target["expr"].replace("$__rate_interval", "1m"))  # HTTP 400 on a bad query
    finally:
        if prom:
            prom.terminate()
            prom.wait(timeout=20)
        assert s.stop() == 0


def test_a_busy_port_for_metrics_is_a_config_error_naming_it():
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
        cfg.write(f"model: {{path: {os.path.join(SOURCE_DIR, 'tests', 'fixtures', 'models', 'llama3-tiny')}}}\n"
                  f"engine: {{backend: cpu, cpu_kv_cache_gib: 0.05}}\n"
                  f"server: {{listen: '127.0.0.1:0', metrics_listen: '127.0.0.1:{port}'}}\n")
        cfg.close()
        r = subprocess.run([os.environ.get("INFERD_BIN", os.path.join(SOURCE_DIR, "build", "server", "inferd")),
                            "--config", cfg.name], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert "server.metrics_listen" in r.stderr and str(port) in r.stderr


def test_health_stays_serving_through_a_prefill_step_far_longer_than_the_liveness_timeout():
    # A 1,500-token prefill in one step of the bundled SmolLM2 on the cpu takes seconds, many times
    # server.liveness_timeout_s, while a request is pending: a busy engine, not a stuck one. Its layers advance
    # (Backend::Progress), so health never leaves SERVING. The stuck case is tests/unit/server/liveness_test.cc.
    model = os.path.join(SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    timeout_s = 0.5
    s = Server(model=model, engine={"backend": "cpu", "cpu_kv_cache_gib": 0.25},
               scheduler={"max_num_seqs": 4, "max_num_batched_tokens": 2048},
               server={"liveness_timeout_s": timeout_s})
    try:
        statuses = []
        watch = health_pb2_grpc.HealthStub(s.channel).Watch(health_pb2.HealthCheckRequest())

        def follow():
            try:
                for r in watch:
                    statuses.append(r.status)
            except grpc.RpcError:
                pass

        t = threading.Thread(target=follow)
        t.start()
        long_prompt = " ".join(f"item {i} is on shelf {i % 7}" for i in range(230))
        t0 = time.time()
        result = s.stub.Generate(greedy(long_prompt, max_tokens=1), timeout=600)
        took = time.time() - t0
        assert result.usage.prompt_tokens > 1400
        # The test means something only if the step outlasted the timeout several times over.
        assert took > 4 * timeout_s, f"the prefill took {took:.2f} s; make the prompt longer"
        time.sleep(2 * timeout_s)
        watch.cancel()
        t.join(timeout=10)
        assert statuses and set(statuses) == {health_pb2.HealthCheckResponse.SERVING}, statuses
        assert "liveness: no engine progress" not in s.logs()
    finally:
        assert s.stop() == 0


def test_profile_steps_logs_where_the_first_steps_time_went():
    s = Server(engine={"backend": "cpu", "cpu_kv_cache_gib": 0.05, "profile_steps": 2})
    try:
        s.stub.Generate(greedy("hello there", max_tokens=4))
        logs = s.logs()
        assert "step 1: 1 seqs" in logs and "step 2: 1 seqs, 1 tokens" in logs, logs
        assert "schedule" in logs and "cpu backend step" in logs and "outputs" in logs
        assert "step 3:" not in logs
    finally:
        assert s.stop() == 0


def test_step_efficiency_counts_bytes_and_flops_as_the_model_shape_says():
    # One request alone: a prefill step of P tokens then N - 1 decode steps at contexts P + 1 .. P + N - 1. The
    # bytes and FLOPs the server exports must equal a count made here from config.json and the weight bytes.
    port = free_port()
    s = Server(server={"metrics_listen": f"127.0.0.1:{port}"})
    try:
        r = s.stub.Generate(greedy("the efficiency of one request " * 3, max_tokens=12))
        P, N = r.usage.prompt_tokens, r.usage.completion_tokens
        assert N == 12
        info = s.stub.GetServerInfo(pb.GetServerInfoRequest())
        assert info.read_ceiling_bytes_per_s > 1e8 and info.gemm_ceiling_flops_per_s > 1e8, info
        with open(os.path.join(SOURCE_DIR, "tests", "fixtures", "models", "llama3-tiny", "config.json")) as f:
            c = json.load(f)
        H, I, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
        D = H // c["num_attention_heads"]
        q, kv = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
        linear = L * (H * (q + 2 * kv) + q * H + 3 * H * I)
        norms = L * 2 * H + H
        element = info.memory_plan.weight_bytes / (linear + norms + 2 * V * H)  # untied: table and LM head
        assert element == 4  # the cpu backend's fp32 weights
        kv_token = info.memory_plan.kv_bytes_per_block / 16
        contexts = [P] + [P + i for i in range(1, N)]
        tokens = [P] + [1] * (N - 1)
        want_bytes = sum(element * (linear + norms + V * H + t * H) + kv_token * ctx for t, ctx in zip(tokens, contexts))
        keys = P * (P + 1) // 2 + sum(contexts[1:])
        want_flops = 2 * linear * (P + N - 1) + 2 * V * H * N + 4 * L * q * keys
        # The answer can leave before the last step's observer has run (its outputs go first): wait for all N.
        deadline = time.time() + 10
        text = scrape(port)
        while sample(text, "inferd_step_device_idle_ratio_count") < N and time.time() < deadline:
            time.sleep(0.02)
            text = scrape(port)
        assert sample(text, "inferd_model_read_bytes_total") == pytest.approx(want_bytes, rel=1e-12)
        assert sample(text, "inferd_model_flops_total") == pytest.approx(want_flops, rel=1e-12)
        assert sample(text, "inferd_generation_tokens_total") == N
        for name, value in [("inferd_device_read_bandwidth_ceiling_bytes_per_second", info.read_ceiling_bytes_per_s),
                            ("inferd_device_gemm_ceiling_flops_per_second", info.gemm_ceiling_flops_per_s)]:
            assert sample(text, name) == pytest.approx(value, rel=1e-12)
        # Per kind of step: one prefill step, N - 1 decode steps, each with a positive utilisation.
        assert sample(text, "inferd_step_model_bandwidth_utilization_ratio_count", kind="prefill") == 1
        assert sample(text, "inferd_step_model_bandwidth_utilization_ratio_count", kind="decode") == N - 1
        assert sample(text, "inferd_step_model_flops_utilization_ratio_count", kind="decode") == N - 1
        for kind in ["prefill", "decode"]:
            assert sample(text, "inferd_step_model_bandwidth_utilization_ratio_sum", kind=kind) > 0
            assert sample(text, "inferd_model_flops_utilization_ratio", kind=kind) > 0
        assert sample(text, "inferd_step_device_idle_ratio_count") == N
        assert 0 <= sample(text, "inferd_device_idle_ratio") <= 1
        # No NVML on the cpu backend: the GPU sensor families are absent rather than zero.
        assert "inferd_gpu_power_watts" not in text and "inferd_energy_per_generated_token_joules" not in text
        assert "device ceilings, measured in" in s.logs()
    finally:
        assert s.stop() == 0
