#!/usr/bin/env python3
"""llama.cpp's own greedy continuations of a GGUF, for the cpu backend's as-stored parity test
(tests/unit/backends/cpu/llamacpp_parity_test.cc): llama.cpp's llama-server (built from the pinned source by
scripts/bench_cpu.sh) with one slot, each prompt's token ids sent as they are, greedy (temperature < 0: llama.cpp's
argmax, with the top five raw log-probabilities of each step), end of sequence ignored, no prompt cache.

    .venv/bin/python scripts/make_llamacpp_reference.py GGUF OUT.json [--tokens 32]
"""
import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "The three primary colors are",
    "In 1969, the first humans to walk on the Moon were",
]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    server = os.path.join(ROOT, "build-llama", "bin", "llama-server")
    if not os.path.exists(server):
        sys.exit("llama-server is missing: bash scripts/bench_cpu.sh builds it")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, "-m", args.gguf, "-t", "2", "-np", "1", "-c", "2048", "--host", "127.0.0.1",
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except Exception:
                time.sleep(0.1)
        cases = []
        for text in TEXTS:
            ids = post(url + "/tokenize", {"content": text, "add_special": True})["tokens"]
            r = post(url + "/completion", {"prompt": ids, "n_predict": args.tokens, "temperature": -1, "n_probs": 5,
                                           "ignore_eos": True, "cache_prompt": False, "return_tokens": True})
            tops = [[[t["id"], t["logprob"]] for t in step["top_logprobs"]] for step in r["completion_probabilities"]]
            cases.append({"text": text, "prompt_ids": ids, "tokens": r["tokens"], "top": tops})
    finally:
        proc.terminate()
        proc.wait()
    with open(os.path.join(ROOT, "third_party", "llama.cpp", ".sha256")) as f:
        source = f.read().strip()[:12]
    ref = {"command": "scripts/make_llamacpp_reference.py " + os.path.basename(args.gguf) + f" --tokens {args.tokens}",
           "llama_cpp_source_sha256": source, "date": datetime.date.today().isoformat(),
           "gguf": os.path.basename(args.gguf), "cases": cases}
    with open(args.out, "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
