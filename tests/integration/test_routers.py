"""Scale-out behind the routers teams run: vLLM's `vllm-router` and SGLang's `sglang-router` (from PyPI) in front of
three unmodified cpu replicas. The official SDK's chat, completion and streaming calls through each router
succeed (the routers add fields of their own, which inferd ignores and names in a response header); the routes the
routers call answer in the shapes they read, with the tokens the engine itself would run; the replica's state is
also exported under vLLM's metric names; server.http_unknown_fields: refuse restores strict refusal."""
import os
import re
import subprocess
import sys
import time

import openai
import pytest
import requests

from conftest import Server, free_port

ROUTERS = {
    "vllm": [os.path.join(os.path.dirname(sys.executable), "vllm-router")],
    "sglang": [os.path.join(os.path.dirname(sys.executable), "sglang-router"), "launch"],
}
CPU = {"backend": "cpu", "block_size": 16, "cpu_kv_cache_gib": 0.25}
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime number."}]


@pytest.fixture(scope="module")
def replicas():
    servers = [Server(model="llama3-tiny", http=True, engine=CPU) for _ in range(3)]
    yield servers
    for s in servers:
        assert s.stop() == 0, s.logs()


def start_router(kind, urls, policy="round_robin", extra=()):
    assert os.path.exists(ROUTERS[kind][0]), "scripts/setup.sh installs the routers (tools/requirements.txt)"
    port, metrics_port = free_port(), free_port()
    log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"inferd-{kind}-router-{port}.log"), "w")
    # Each router also serves its own Prometheus metrics, on 29000 unless told: a free port, so that routers of
    # runs side by side do not collide.
    proc = subprocess.Popen(ROUTERS[kind] + ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
                                             "--policy", policy, "--prometheus-host", "127.0.0.1",
                                             "--prometheus-port", str(metrics_port), *extra],
                            stdout=log, stderr=subprocess.STDOUT)
    proc.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    proc.log_path = log.name
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        assert proc.poll() is None, f"the {kind} router exited: see {log.name}"
        try:
            if requests.get(url + "/v1/models", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        time.sleep(0.25)
    return proc, url


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_the_sdk_works_through_each_router_unmodified(replicas, kind):
    proc, url = start_router(kind, [r.http_url for r in replicas])
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        for i in range(6):  # round robin: every replica answers twice
            r = client.chat.completions.create(model="llama3-tiny", messages=CHAT, max_tokens=4, seed=i)
            assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1
        c = client.completions.create(model="llama3-tiny", prompt="The scheduler", max_tokens=4)
        assert c.choices[0].finish_reason in ("stop", "length")
        chunks = list(client.chat.completions.create(model="llama3-tiny", messages=CHAT, max_tokens=4, stream=True))
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    served = [sum(float(v) for v in re.findall(r"^inferd_request_success_total\{[^}]*\} (\S+)$",
                                               requests.get(r.http_url + "/metrics").text, re.M))
              for r in replicas]
    assert all(v >= 1 for v in served), f"every replica served requests: {served}"


def test_unknown_fields_are_ignored_and_named_known_ones_honoured_or_refused(replicas):
    url = replicas[0].http_url + "/v1/chat/completions"
    r = requests.post(url, json={"messages": CHAT, "max_tokens": 2, "separate_reasoning": True, "frobnicate": 1,
                                 "rid": "router-7"})
    assert r.status_code == 200, r.text
    assert r.headers["X-Inferd-Ignored-Fields"] == "frobnicate", r.headers
    assert r.json()["id"]
    # A name that would shape the header is reduced to safe characters.
    r = requests.post(url, json={"messages": CHAT, "max_tokens": 1, "a\r\nSet-Cookie: x": 1})
    assert r.status_code == 200 and r.headers["X-Inferd-Ignored-Fields"] == "a??Set-Cookie??x"
    # Known fields whose value asks for what inferd does not do.
    for field in ({"continue_final_message": True}, {"return_hidden_states": True}, {"lora_path": "a"},
                  {"chat_template_kwargs": {"enable_thinking": False}}):
        r = requests.post(url, json={"messages": CHAT, "max_tokens": 1, **field})
        assert r.status_code == 400 and next(iter(field)) in r.json()["error"]["message"], r.text
    r = requests.post(url, json={"messages": CHAT, "max_tokens": 1, "continue_final_message": False,
                                 "return_hidden_states": False})
    assert r.status_code == 200 and "X-Inferd-Ignored-Fields" not in r.headers
    metrics = requests.get(replicas[0].http_url + "/metrics").text
    assert float(re.search(r"^inferd_http_ignored_fields_total (\S+)", metrics, re.M).group(1)) == 2


def test_strict_mode_refuses_unknown_fields():
    s = Server(model="llama3-tiny", http=True, engine=CPU, server={"http_unknown_fields": "refuse"})
    try:
        r = requests.post(s.http_url + "/v1/chat/completions", json={"messages": CHAT, "frobnicate": 1})
        assert r.status_code == 400 and "frobnicate" in r.json()["error"]["message"]
    finally:
        assert s.stop() == 0, s.logs()


def test_the_routes_routers_call_answer_in_their_shapes(replicas):
    u = replicas[1].http_url
    # Render: the tokens a generate request with the same body runs (its usage counts them).
    body = {"model": "llama3-tiny", "messages": CHAT}
    ids = requests.post(u + "/v1/chat/completions/render", json=body).json()["token_ids"]
    gen = requests.post(u + "/v1/chat/completions", json={**body, "max_tokens": 1}).json()
    assert len(ids) == gen["usage"]["prompt_tokens"] and all(isinstance(t, int) for t in ids)
    tok = requests.post(u + "/tokenize", json={"messages": CHAT}).json()
    assert tok["tokens"] == ids and tok["count"] == len(ids) and tok["max_model_len"] > len(ids)
    text = requests.post(u + "/detokenize", json={"tokens": ids}).json()["prompt"]
    assert "You are terse." in text and "Name a prime number." in text, text
    one = requests.post(u + "/v1/completions/render", json={"model": "llama3-tiny", "prompt": "a b"}).json()
    gen = requests.post(u + "/v1/completions", json={"prompt": "a b", "max_tokens": 1}).json()
    assert len(one["token_ids"]) == gen["usage"]["prompt_tokens"]
    two = requests.post(u + "/v1/completions/render", json={"prompt": ["a", "b c"]}).json()
    assert [len(x["token_ids"]) for x in two] == [len(requests.post(u + "/tokenize", json={"prompt": p}).json()["tokens"])
                                                  for p in ["a", "b c"]]
    assert requests.post(u + "/detokenize", json={"tokens": [10 ** 9]}).status_code == 400
    # Load, and what the replica serves.
    (load,) = requests.get(u + "/get_load").json()
    assert set(load) >= {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"} and load["num_reqs"] == 0
    loads = requests.get(u + "/v1/loads").json()["loads"]
    assert loads[0]["max_total_num_tokens"] > 0 and 0 <= loads[0]["token_usage"] <= 1
    for path in ("/server_info", "/get_server_info"):
        info = requests.get(u + path).json()
        assert info["served_model_name"] == "llama3-tiny" and info["max_running_requests"] > 0
    model = requests.get(u + "/model_info").json()
    assert model["architectures"] == ["LlamaForCausalLM"] and model["is_generation"] is True
    metrics = requests.get(u + "/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert re.search(rf'^{name}\{{model_name="llama3-tiny"\}} \S+$', metrics, re.M), name


@pytest.mark.parametrize("how", ["drain", "kill"])
def test_a_replica_drained_or_killed_mid_run_loses_no_request_silently(how):
    """Streams through vllm-router to two replicas, one of which is drained (SIGTERM) or killed (SIGKILL) while
    they run: every stream either ends with a finish_reason or its client gets an error (none is cut short
    silently, none hangs), and requests after it are still served, by the replica that is left."""
    import concurrent.futures
    import signal
    servers = [Server(model="llama3-tiny", http=True, engine=CPU, server={"drain_timeout_s": 30}) for _ in range(2)]
    proc, url = start_router("vllm", [s.http_url for s in servers])
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)

    def one(i):
        try:
            finish, text = None, ""
            for chunk in client.chat.completions.create(model="llama3-tiny", messages=CHAT, max_tokens=380,
                                                        stream=True, extra_body={"ignore_eos": True}, seed=i):
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    finish = chunk.choices[0].finish_reason or finish
            return ("finished", finish) if finish else ("cut short", text)
        except Exception as e:  # an error the client sees
            return ("error", type(e).__name__)

    try:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(one, i) for i in range(16)]
            time.sleep(0.3)
            victim = servers[1].proc
            victim.send_signal(signal.SIGTERM if how == "drain" else signal.SIGKILL)
            results = [f.result(timeout=120) for f in futures]
        assert all(r[0] in ("finished", "error") for r in results), results
        if how == "drain":  # a drained replica finishes what it accepted
            assert all(r == ("finished", "length") for r in results), results
        assert victim.wait(timeout=60) is not None
        served = 0
        for i in range(6):  # the router may still try the gone replica: an error, never a wrong answer
            try:
                r = client.chat.completions.create(model="llama3-tiny", messages=CHAT, max_tokens=2, seed=i)
                served += r.choices[0].finish_reason in ("stop", "length")
            except openai.APIError:
                pass
        assert served >= 3, "the replica that is left serves"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        assert servers[0].stop() == 0, servers[0].logs()
        if servers[1].proc.poll() is None:
            servers[1].stop()


def test_vllm_routers_kv_aware_policy_indexes_the_replicas_kv_events():
    """vllm-router's kv_aware policy subscribes to each replica's KV-cache events (kv_events) and finds a repeated
    conversation's prefix in its index of them: its lookups hit, and it reads every batch without a decode error."""
    ports = [(free_port(), free_port()) for _ in range(2)]
    servers = [Server(model="llama3-tiny", http=True, engine=CPU,
                      kv_events={"enabled": "true", "endpoint": f"tcp://127.0.0.1:{pub}",
                                 "replay_endpoint": f"tcp://127.0.0.1:{rep}"}) for pub, rep in ports]
    extra = ["--kv-event-block-size", "16", "--kv-event-model", "llama3-tiny"]
    for s, (pub, rep) in zip(servers, ports):
        extra += ["--kv-event-source", f"{s.http_url}=tcp://127.0.0.1:{pub}",
                  "--kv-event-replay-source", f"{s.http_url}=tcp://127.0.0.1:{rep}"]
    proc, url = start_router("vllm", [s.http_url for s in servers], policy="kv_aware", extra=extra)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        system = {"role": "system", "content": " ".join(f"rule {i}: be brief." for i in range(8))}
        for i in range(6):
            r = client.chat.completions.create(model="llama3-tiny", max_tokens=4,
                                               messages=[system, {"role": "user", "content": f"question {i}"}])
            assert r.choices[0].finish_reason in ("stop", "length")
            time.sleep(0.5)  # the replica's events reach the router between requests
        metrics = requests.get(proc.metrics_url, timeout=10).text
        hits = re.search(r'^vllm_router_kv_placement_lookups_total\{result="hit"\} (\S+)$', metrics, re.M)
        assert hits and float(hits.group(1)) >= 3, metrics
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for s in servers:
            assert s.stop() == 0, s.logs()
    with open(proc.log_path) as f:
        log = f.read()
    assert "decode batch" not in log, log[-2000:]
