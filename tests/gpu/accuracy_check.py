#!/usr/bin/env python3
"""On the GPU machine: what engine.quantization = fp8 costs in accuracy on real weights.

Serves the bundled SmolLM2-135M-Instruct (GGUF, dequantized to bf16 at load) on cuda once per configuration — bf16,
then fp8 (the weights quantized by inferd at load) — and for each runs `inferd-bench perplexity` over the King
James text (scripts/fetch_eval_text.sh) and greedy generation on the reference prompts
(tests/fixtures/reference/smollm2-135m-instruct.json: plain text, code, CJK and a chat turn) and a few chat
questions. Reports each configuration's perplexity against bf16's and how many greedy tokens agree with bf16's
before the first difference. Exits 1 when a perplexity is more than --max-increase (1.5%) above bf16's.

  python3 tests/gpu/accuracy_check.py --bin inferd --bench inferd-bench --model GGUF --text FILE --out F.json
      [--window 2048] [--configs bf16,fp8] [--backend cuda]
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from inferd.v1 import inferd_pb2 as pb, inferd_pb2_grpc

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHATS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain what a GPU is in two sentences.",
         "List three prime numbers.", "How do I reverse a list in Python?"]
CONFIGS = [("bf16", {"quantization": "none"}), ("fp8", {"quantization": "fp8"})]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, engine, log_path):
    port = free_port()
    cfg = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    settings = ", ".join(f"{k}: {v}" for k, v in {"backend": args.backend, "dtype": "bfloat16", **engine}.items())
    cfg.write(f"model: {{path: {args.model}}}\nengine: {{{settings}}}\n"
              "scheduler: {max_num_seqs: 64, max_num_batched_tokens: 8192, max_queue: 1000}\n"
              f"server: {{listen: '127.0.0.1:{port}', metrics_listen: \"\"}}\n")
    cfg.close()
    log = open(log_path, "w")
    proc = subprocess.Popen([args.bin, "--config", cfg.name], stdout=log, stderr=subprocess.STDOUT)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    health = health_pb2_grpc.HealthStub(channel)
    end = time.time() + 300
    while True:
        if proc.poll() is not None or time.time() > end:
            sys.exit(f"inferd did not start serving (see {log_path})")
        try:
            if health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == \
                    health_pb2.HealthCheckResponse.SERVING:
                return proc, f"127.0.0.1:{port}", inferd_pb2_grpc.InferenceStub(channel)
        except grpc.RpcError:
            time.sleep(0.5)


def greedy(stub, max_tokens):
    ref = json.load(open(os.path.join(SOURCE_DIR, "tests/fixtures/reference/smollm2-135m-instruct.json")))
    requests = []
    for case in ref["cases"]:
        r = pb.GenerateRequest(sampling=pb.SamplingParams(temperature=0),
                               stopping=pb.StoppingParams(max_tokens=max_tokens, ignore_eos=True))
        r.token_ids.ids.extend(case["prompt_ids"])
        requests.append(r)
    for question in CHATS:
        r = pb.GenerateRequest(sampling=pb.SamplingParams(temperature=0),
                               stopping=pb.StoppingParams(max_tokens=max_tokens, ignore_eos=True))
        r.messages.messages.add(role="user", content=question)
        requests.append(r)
    return [list(stub.Generate(r).token_ids) for r in requests]


def agreement(ours, base):
    """Tokens equal to the baseline's before the first difference, summed over prompts; prompts equal throughout."""
    agreed = identical = 0
    for a, b in zip(ours, base):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        agreed += n
        identical += a == b
    return agreed, identical


def main():
    ap = argparse.ArgumentParser()
    for a in ["--bin", "--bench", "--model", "--text", "--out"]:
        ap.add_argument(a, required=True)
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--configs", default="bf16,fp8", help="of: " + ", ".join(n for n, _ in CONFIGS))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-increase", type=float, default=0.015)
    args = ap.parse_args()
    stem = os.path.splitext(args.out)[0]
    report = {"model": args.model, "text": args.text, "window": args.window, "runs": {}}
    for name, engine in [c for c in CONFIGS if c[0] in args.configs.split(",")]:
        proc, address, stub = start(args, engine, f"{stem}_{name}_server.log")
        try:
            ppl_json = f"{stem}_{name}_perplexity.json"
            run = subprocess.run([args.bench, "perplexity", args.text, "--address", address, "--window",
                                  str(args.window), "--json", ppl_json], capture_output=True, text=True)
            print(run.stdout, end="")
            if run.returncode != 0:
                sys.exit(f"perplexity failed for {name}: {run.stderr}")
            report["runs"][name] = {"engine": engine, "perplexity": json.load(open(ppl_json)),
                                    "greedy": greedy(stub, args.max_tokens)}
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    base = report["runs"]["bf16"]
    failed = False
    print(f"{'run':6s} {'perplexity':>11s} {'vs bf16':>8s}  greedy tokens agreeing with bf16 before the first "
          f"difference (prompts identical)")
    for name, run in report["runs"].items():
        ppl = run["perplexity"]["perplexity"]
        increase = ppl / base["perplexity"]["perplexity"] - 1
        agreed, identical = agreement(run["greedy"], base["greedy"])
        total = sum(len(g) for g in base["greedy"])
        run.update(increase=increase, greedy_agreed=agreed, greedy_total=total, prompts_identical=identical)
        print(f"{name:6s} {ppl:11.4f} {100 * increase:+7.2f}%  {agreed} of {total} ({identical} of "
              f"{len(base['greedy'])} prompts)")
        failed |= increase > args.max_increase
    json.dump(report, open(args.out, "w"), indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
