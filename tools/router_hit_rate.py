#!/usr/bin/env python3
"""The fleet's prefix-cache hit rate behind vllm-router, by policy: three inferd replicas on the cpu backend (the
bundled SmolLM2), 20 conversations of 6 turns over a shared system prompt sent through the router, turn by turn
(each conversation's next turn sends its whole history), under round_robin, cache_aware and kv_aware (fed by the
replicas' KV-cache events). Prints, per policy, the prompt tokens the replicas looked up in their prefix caches, those found, the hit rate and the mean time to first
token; --json writes them.

    .venv/bin/python tools/router_hit_rate.py [--policies round_robin cache_aware kv_aware] [--json out.json]
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import time

import openai
import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))
from conftest import SMOLLM2, Server, free_port  # noqa: E402

SYSTEM = "You are a helpful assistant for the paged cache team."
WORDS = "the scheduler batches tokens over a paged cache of blocks and the engine runs each step".split()


def counters(url):
    text = requests.get(url + "/metrics", timeout=10).text
    get = lambda name: float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))
    return get("inferd_prefix_cache_queries_tokens_total"), get("inferd_prefix_cache_hits_tokens_total")


def run(policy, conversations, turns, seed):
    # kv_aware: each replica publishes its KV-cache events (kv_events) and the router subscribes to them.
    events = [(free_port(), free_port()) for _ in range(3)] if policy == "kv_aware" else [None] * 3
    replicas = [Server(model=SMOLLM2, http=True,
                       engine={"backend": "cpu", "block_size": 16, "cpu_kv_cache_gib": 0.25},
                       **({"kv_events": {"enabled": "true", "endpoint": f"tcp://127.0.0.1:{e[0]}",
                                         "replay_endpoint": f"tcp://127.0.0.1:{e[1]}"}} if e else {}))
                for e in events]
    port = free_port()
    extra = []
    for r, e in zip(replicas, events):
        if e:
            extra += ["--kv-event-source", f"{r.http_url}=tcp://127.0.0.1:{e[0]}",
                      "--kv-event-replay-source", f"{r.http_url}=tcp://127.0.0.1:{e[1]}"]
    if extra:  # the router matches events to requests by the model they name
        served = requests.get(replicas[0].http_url + "/v1/models", timeout=10).json()["data"][0]["id"]
        extra += ["--kv-event-block-size", "16", "--kv-event-model", served]
    router = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "vllm-router"), "--host", "127.0.0.1",
                               "--port", str(port), "--worker-urls", *[r.http_url for r in replicas], "--policy",
                               policy, "--prometheus-port", str(free_port()), *extra],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                if requests.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.25)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        rng = random.Random(seed)
        histories = [[{"role": "system", "content": SYSTEM}] for _ in range(conversations)]
        before = [counters(r.http_url) for r in replicas]
        ttfts = []
        for _ in range(turns):
            for h in histories:
                h.append({"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(10))})
                start = time.perf_counter()
                stream = client.chat.completions.create(messages=h, model=model, max_tokens=8, stream=True,
                                                        temperature=0)
                answer, first = "", None
                for chunk in stream:
                    if first is None and chunk.choices and chunk.choices[0].delta.content:
                        first = time.perf_counter() - start
                    answer += (chunk.choices[0].delta.content or "") if chunk.choices else ""
                ttfts.append(first or time.perf_counter() - start)
                h.append({"role": "assistant", "content": answer})
        after = [counters(r.http_url) for r in replicas]
        queries = sum(a[0] - b[0] for a, b in zip(after, before))
        hits = sum(a[1] - b[1] for a, b in zip(after, before))
        return {"policy": policy, "queried_tokens": queries, "hit_tokens": hits, "hit_rate": hits / max(queries, 1),
                "mean_ttft_ms": 1e3 * sum(ttfts) / len(ttfts)}
    finally:
        router.terminate()
        router.wait(timeout=30)
        for r in replicas:
            r.stop()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--policies", nargs="+", default=["round_robin", "cache_aware"])
    p.add_argument("--conversations", type=int, default=20)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json")
    args = p.parse_args()
    results = [run(policy, args.conversations, args.turns, args.seed) for policy in args.policies]
    for r in results:
        print(f"{r['policy']:12s} hit rate {r['hit_rate']:.3f} ({r['hit_tokens']:.0f} of {r['queried_tokens']:.0f} "
              f"prompt tokens)  mean TTFT {r['mean_ttft_ms']:.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
