#!/usr/bin/env python3
"""A small command-line client for inferd (Python grpcio, stubs generated from the proto on the fly, or taken from
the directory INFERD_PY_STUBS names where grpcio-tools is missing).

    .venv/bin/python tools/inferd_client.py chat "What is the capital of France?"
    .venv/bin/python tools/inferd_client.py chat "Hi" --system "You answer in one word."
    .venv/bin/python tools/inferd_client.py generate "The capital of France is" --max-tokens 32
    .venv/bin/python tools/inferd_client.py info
"""
import argparse
import os
import sys
import tempfile

import grpc

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def stubs():
    if os.environ.get("INFERD_PY_STUBS"):
        sys.path.insert(0, os.environ["INFERD_PY_STUBS"])
        from inferd.v1 import inferd_pb2, inferd_pb2_grpc
        return inferd_pb2, inferd_pb2_grpc
    from grpc_tools import protoc
    out = tempfile.mkdtemp(prefix="inferd-client-")
    if protoc.main(["protoc", f"-I{ROOT}/proto", f"--python_out={out}", f"--grpc_python_out={out}",
                    f"{ROOT}/proto/inferd/v1/inferd.proto"]) != 0:
        sys.exit("protoc failed")
    sys.path.insert(0, out)
    from inferd.v1 import inferd_pb2, inferd_pb2_grpc
    return inferd_pb2, inferd_pb2_grpc


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--address", default="127.0.0.1:50051")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("generate", "chat"):
        g = sub.add_parser(name)
        g.add_argument("text", help="the prompt (generate) or the user's message (chat)")
        g.add_argument("--max-tokens", type=int, default=128 if name == "chat" else 64)
        g.add_argument("--temperature", type=float, default=0.0)
        g.add_argument("--seed", type=int)
        g.add_argument("--stop", action="append", default=[])
        if name == "chat":
            g.add_argument("--system", help="a system message before the user's")
    sub.add_parser("info")
    args = p.parse_args()
    pb, pb_grpc = stubs()
    stub = pb_grpc.InferenceStub(grpc.insecure_channel(args.address))
    if args.cmd == "info":
        print(stub.GetModelInfo(pb.GetModelInfoRequest()))
        print(stub.GetServerInfo(pb.GetServerInfoRequest()))
        return
    sampling = pb.SamplingParams(temperature=args.temperature)
    if args.seed is not None:
        sampling.seed = args.seed
    req = pb.GenerateRequest(sampling=sampling, stopping=pb.StoppingParams(max_tokens=args.max_tokens, stop=args.stop))
    if args.cmd == "chat":
        if args.system:
            req.messages.messages.add(role="system", content=args.system)
        req.messages.messages.add(role="user", content=args.text)
    else:
        req.text = args.text
    last = None
    for chunk in stub.GenerateStream(req):
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        last = chunk
    print()
    t = last.timing
    # Decode speed: the tokens after the first over the time after it.
    decode_s = t.total_s - t.time_to_first_token_s
    n = last.usage.completion_tokens
    rate = f", {(n - 1) / decode_s:.0f} tokens/s" if n > 1 and decode_s > 0 else ""
    print(f"[{pb.FinishReason.Name(last.finish_reason)}; {last.usage.prompt_tokens} prompt + "
          f"{last.usage.completion_tokens} tokens; ttft {t.time_to_first_token_s * 1000:.1f} ms, "
          f"total {t.total_s * 1000:.1f} ms{rate}]", file=sys.stderr)


if __name__ == "__main__":
    main()
