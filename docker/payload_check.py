#!/usr/bin/env python3
"""The GPU image's payload serving from outside it (scripts/gpu_run.sh image): starts the server command given
after `--` (the image's own inferd in a chroot of the image's root), times start to SERVING through
grpc.health.v1, runs the image's own health probe, sends a generate request and 64 concurrent streams from
outside, reads the server's resident memory, then checks the drain on SIGTERM (image_check.check_drain).
    payload_check.py --address HOST:PORT --probe 'CMD' --out results.json --server-log LOG -- SERVER ARGV..."""
import argparse
import json
import shlex
import subprocess
import sys
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from image_check import check_drain, pb, pb_grpc


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--probe", required=True, help="the image's health probe, run as a command")
    p.add_argument("--out", required=True)
    p.add_argument("--server-log", required=True)
    p.add_argument("server", nargs=argparse.REMAINDER)
    args = p.parse_args()
    argv = args.server[1:] if args.server[:1] == ["--"] else args.server
    channel = grpc.insecure_channel(args.address)
    health = health_pb2_grpc.HealthStub(channel)
    start = time.monotonic()
    server = subprocess.Popen(argv, stdout=open(args.server_log, "w"), stderr=subprocess.STDOUT)
    try:
        while True:
            if server.poll() is not None:
                sys.exit(f"the server exited {server.returncode} before SERVING")
            if time.monotonic() - start > 300:
                sys.exit("the server was not SERVING after 300 s")
            try:
                if health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        result = {"start_to_serving_s": round(time.monotonic() - start, 2)}
        result["probe_exit"] = subprocess.run(shlex.split(args.probe), capture_output=True).returncode
        assert result["probe_exit"] == 0, "the image's health probe failed against a SERVING server"

        stub = pb_grpc.InferenceStub(channel)
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        result["model"] = info.name
        r = stub.Generate(pb.GenerateRequest(text="The capital of France is", sampling=pb.SamplingParams(temperature=0),
                                             stopping=pb.StoppingParams(max_tokens=32, ignore_eos=True)), timeout=60)
        assert r.usage.completion_tokens == 32, r.usage

        streams, tokens = 64, 128
        counts = [0] * streams

        def one(i):
            for chunk in stub.GenerateStream(pb.GenerateRequest(
                    text=f"Request {i}: tell me a story.", sampling=pb.SamplingParams(temperature=0),
                    stopping=pb.StoppingParams(max_tokens=tokens, ignore_eos=True)), timeout=120):
                counts[i] += len(chunk.token_ids)
        begin = time.monotonic()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.monotonic() - begin
        assert counts == [tokens] * streams, counts
        result["streams_64x128_tokens_per_s"] = round(streams * tokens / seconds)
        with open(f"/proc/{server.pid}/status") as f:
            rss_kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        result["resident_gib"] = round(rss_kib / 2**20, 2)
        print(json.dumps(result))
        check_drain(stub, lambda: server.send_signal(15), lambda: server.wait(timeout=90))
        result["drain"] = "ok"
    finally:
        if server.poll() is None:
            server.kill()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
