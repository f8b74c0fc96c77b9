"""10,000 requests against the real server on the cpu backend with a tiny model and a tiny KV pool: random prompt
and output lengths, priorities, deadlines, 30% cancelled at random points, 64 clients at once. At the end nothing
runs or waits, every KV block is back, and every request is accounted for with an expected status.

    .venv/bin/python tests/soak/scheduler_soak.py [--requests N] [--seed S] [--swap-gib G] [--host-gib G]
        [--backend cuda --model DIR] [--num-blocks N] [--log FILE]

With --host-gib (engine.host_kv_cache_gib, the prefix cache's host tier) half of the prompts start with one of 16
shared preambles, so that evicted prefix blocks are written to the host and restored from it.

On a GPU (--backend cuda, with a model such as the 8B one of tools/make_llama3_8b_random.py) with swap space, it is
a swap storm: every step is profiled (engine.profile_steps) and --log keeps the server's log, from which
tests/gpu/copy_timeline.py draws both streams and compares steps with copies under them to steps without.

Outside the default test run (a few minutes); needs a build (bash scripts/test.sh makes one).
"""
import argparse
import collections
import os
import random
import sys
import threading
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from conftest import Server, inferd_pb2 as pb, wait_until_idle  # noqa: E402

EXPECTED = {"OK", "CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--swap-gib", type=float, default=0, help="engine.swap_space_gib (0: preemption recomputes)")
    ap.add_argument("--host-gib", type=float, default=0, help="engine.host_kv_cache_gib (0: no host tier)")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"], help="engine.backend")
    ap.add_argument("--model", default="llama3-tiny", help="a test model's name, or a model directory")
    ap.add_argument("--num-blocks", type=int, default=48, help="engine.num_blocks (the device pool)")
    ap.add_argument("--log", help="copy the server's log here at the end")
    args = ap.parse_args()
    preambles = [" ".join(f"p{k}x{j}" for j in range(8 + k)) for k in range(16)]  # 8-23 words
    engine = {"backend": args.backend, "block_size": 16, "num_blocks": args.num_blocks,
              "swap_space_gib": args.swap_gib, "host_kv_cache_gib": args.host_gib}
    if args.backend == "cuda":
        engine["profile_steps"] = 1000000
    s = Server(model=args.model, engine=engine,
               scheduler={"max_num_seqs": 32, "max_num_batched_tokens": 256, "max_queue": 64,
                          "long_prefill_chunk": 64, "priority_aging_s": 1})
    outcomes = collections.Counter()
    lock = threading.Lock()
    next_index = [0]
    t0 = time.time()

    def client(cid):
        rng = random.Random(args.seed * 1000 + cid)
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= args.requests:
                return
            prompt = " ".join(f"w{rng.randrange(1000)}" for _ in range(rng.randint(1, 60)))
            if args.host_gib > 0 and rng.random() < 0.5:
                prompt = rng.choice(preambles) + " " + " ".join(prompt.split()[:30])
            req = pb.GenerateRequest(
                text=prompt, priority=rng.randint(-2, 2),
                sampling=pb.SamplingParams(temperature=rng.choice([0.0, 0.8]), seed=rng.randrange(1 << 30)),
                stopping=pb.StoppingParams(max_tokens=rng.randint(1, 120), ignore_eos=True))
            timeout = rng.uniform(0.05, 2.0) if rng.random() < 0.1 else None
            cancel_after = rng.randint(0, 30) if rng.random() < 0.3 else None
            try:
                stream = s.stub.GenerateStream(req, timeout=timeout)
                got = 0
                for chunk in stream:
                    got += len(chunk.token_ids)
                    if cancel_after is not None and got >= cancel_after:
                        stream.cancel()
                code = "OK"
            except grpc.RpcError as e:
                code = e.code().name
            with lock:
                outcomes[code] += 1
                done = sum(outcomes.values())
                if done % 1000 == 0:
                    print(f"{done} requests, {time.time() - t0:.0f} s: {dict(outcomes)}", flush=True)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    info = wait_until_idle(s.stub, timeout=30)
    elapsed = time.time() - t0
    rc = s.stop()
    if args.log:
        with open(args.log, "w") as f:
            f.write(s.logs())
    total = sum(outcomes.values())
    print(f"{total} requests in {elapsed:.0f} s: {dict(outcomes)}")
    print(f"after: running {info.running_requests}, waiting {info.waiting_requests}, free blocks "
          f"{info.free_kv_blocks}/{info.total_kv_blocks} ({info.cached_kv_blocks} cached), preemptions "
          f"{info.preemptions_total} ({info.swapped_preemptions_total} to swap space, {info.preempted_tokens_total} "
          f"tokens recomputed), prefix cache hit rate "
          f"{info.prefix_cache_hit_rate:.3f} ({info.host_prefix_cache_hit_tokens} tokens from the host tier), host "
          f"pool {info.host_kv_blocks} blocks ({info.host_cached_kv_blocks} cached, {info.host_swapped_kv_blocks} "
          f"swapped); server exit {rc}")
    ok = (total == args.requests and set(outcomes) <= EXPECTED and info.running_requests == 0
          and info.waiting_requests == 0 and info.free_kv_blocks == info.total_kv_blocks
          and info.host_swapped_kv_blocks == 0 and rc == 0)
    if args.host_gib > 0:
        ok = ok and info.host_prefix_cache_hit_tokens > 0
    print("soak: PASS" if ok else "soak: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
