#!/usr/bin/env python3
"""Structured output's cost on a served model: the same requests with and without a JSON schema, through the
OpenAI completions API of a real inferd (started here), at 64 concurrent streams and one at a time. Every request
asks for exactly --max-tokens tokens (ignore_eos; the schema, an array of at least 400 one-digit integers, cannot
end sooner), so the two runs generate the same tokens and their rates compare directly. Prints tokens/s of each,
their ratio, and the mask time per masked token from the server's metrics
(inferd_structured_output_mask_seconds_total / inferd_structured_output_masked_rows_total).

    python3 tools/structured_bench.py --inferd build/server/inferd --model DIR [--load-format dummy] [--json OUT]

Only the Python standard library: it runs where the server runs (the GPU host).
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 400}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def metric(url, name):
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def run(url, model, concurrency, requests, max_tokens, schema):
    body = {"model": model, "prompt": "Numbers:", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if schema:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "digits", "schema": schema}}
    tokens, errors, lock = [0], [], threading.Lock()
    queue = list(range(requests))

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                queue.pop()
            try:
                r = post(url + "/v1/completions", body)
                with lock:
                    tokens[0] += r["usage"]["completion_tokens"]
            except Exception as e:  # noqa: BLE001 - reported, and the run fails
                with lock:
                    errors.append(str(e)[:200])

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[0]}")
    return {"tokens": tokens[0], "seconds": wall, "tokens_per_s": tokens[0] / wall}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--inferd", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--json")
    a = p.parse_args()
    port, http = free_port(), free_port()
    cfg = (f"model: {{path: {a.model}, load_format: {a.load_format}}}\n"
           f"scheduler: {{max_num_seqs: 64, max_num_batched_tokens: 8192}}\n"
           f"server: {{listen: '127.0.0.1:{port}', http_listen: '127.0.0.1:{http}', metrics_listen: ''}}\n")
    fd, path = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(cfg)
    log = open(os.path.join(tempfile.gettempdir(), "structured_bench_inferd.log"), "w")
    proc = subprocess.Popen([a.inferd, "--config", path], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{http}"
    try:
        for _ in range(1200):
            if proc.poll() is not None:
                raise RuntimeError(f"inferd exited: see {log.name}")
            try:
                model = json.loads(urllib.request.urlopen(url + "/v1/models", timeout=2).read())["data"][0]["id"]
                break
            except Exception:  # noqa: BLE001 - still starting
                time.sleep(0.25)
        results = {}
        run(url, model, 64, 64, 16, None)  # warm-up: graphs, the allocator, the schema's compile and cache
        run(url, model, 64, 64, 16, SCHEMA)
        for name, concurrency, requests in (("batch 64", 64, 128), ("batch 1", 1, 4)):
            plain = run(url, model, concurrency, requests, a.max_tokens, None)
            s0, r0 = metric(url, "inferd_structured_output_mask_seconds_total"), \
                metric(url, "inferd_structured_output_masked_rows_total")
            constrained = run(url, model, concurrency, requests, a.max_tokens, SCHEMA)
            s1, r1 = metric(url, "inferd_structured_output_mask_seconds_total"), \
                metric(url, "inferd_structured_output_masked_rows_total")
            assert plain["tokens"] == constrained["tokens"], (plain, constrained)
            results[name] = {"plain": plain, "json_schema": constrained,
                             "ratio": constrained["tokens_per_s"] / plain["tokens_per_s"],
                             "mask_us_per_token": (s1 - s0) / max(r1 - r0, 1) * 1e6}
            print(f"{name}: plain {plain['tokens_per_s']:.0f} tokens/s, json_schema {constrained['tokens_per_s']:.0f} "
                  f"({results[name]['ratio']:.3f}x), mask {results[name]['mask_us_per_token']:.1f} us per masked "
                  f"token", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
