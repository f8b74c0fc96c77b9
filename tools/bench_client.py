#!/usr/bin/env python3
"""Load generator: N concurrent greedy streams against a running inferd; prints throughput and latency.

    .venv/bin/python tools/bench_client.py --address 127.0.0.1:50051 --concurrency 1 8 32 --max-tokens 64
"""
import argparse
import statistics
import threading
import time

import grpc

from inferd_client import stubs


def run(stub, pb, concurrency, prompt_tokens, max_tokens):
    results, errors = [], []

    def one(i):
        req = pb.GenerateRequest(sampling=pb.SamplingParams(temperature=0),
                                 stopping=pb.StoppingParams(max_tokens=max_tokens, ignore_eos=True))
        req.token_ids.ids.extend([(i * 7 + k * 13) % 200 + 10 for k in range(prompt_tokens)])
        start = time.perf_counter()
        first, n = None, 0
        try:
            for chunk in stub.GenerateStream(req):
                if chunk.token_ids and first is None:
                    first = time.perf_counter() - start
                n += len(chunk.token_ids)
            results.append((first, time.perf_counter() - start, n))
        except grpc.RpcError as e:
            errors.append(e)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r[2] for r in results)
    ttft = statistics.median(r[0] for r in results)
    decode = statistics.median((r[2] - 1) / (r[1] - r[0]) for r in results if r[2] > 1)
    return {"concurrency": concurrency, "errors": len(errors), "tokens": tokens, "wall_s": wall,
            "tok_per_s": tokens / wall, "ttft_ms_p50": ttft * 1e3, "per_stream_tok_per_s_p50": decode}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--address", default="127.0.0.1:50051")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()
    pb, pb_grpc = stubs()
    stub = pb_grpc.InferenceStub(grpc.insecure_channel(args.address))
    print(f"{'conc':>5} {'tokens':>7} {'wall_s':>7} {'tok/s':>8} {'ttft_ms':>8} {'stream tok/s':>12} {'errors':>6}")
    for c in args.concurrency:
        r = run(stub, pb, c, args.prompt_tokens, args.max_tokens)
        print(f"{r['concurrency']:>5} {r['tokens']:>7} {r['wall_s']:>7.2f} {r['tok_per_s']:>8.1f} "
              f"{r['ttft_ms_p50']:>8.1f} {r['per_stream_tok_per_s_p50']:>12.1f} {r['errors']:>6}")


if __name__ == "__main__":
    main()
