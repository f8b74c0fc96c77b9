#!/usr/bin/env python3
"""From outside the container (docker/test-image.sh): a generate and a chat request over gRPC, a chat over the
OpenAI-compatible HTTP API with the openai SDK, then SIGTERM during a stream:
the stream finishes, a new request is UNAVAILABLE, the container exits 0. check_drain serves docker/payload_check.py
too."""
import os
import subprocess
import sys
import threading
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from inferd_client import stubs  # noqa: E402

pb, pb_grpc = stubs()


def check_drain(stub, terminate, wait_exit, tokens=200):
    """SIGTERM (terminate()) while a stream of `tokens` runs: it finishes, a new request is UNAVAILABLE, and the
    server exits 0 (wait_exit() returns its exit code)."""
    stream = stub.GenerateStream(pb.GenerateRequest(
        text="Tell me a long story.", sampling=pb.SamplingParams(temperature=0),
        stopping=pb.StoppingParams(max_tokens=tokens, ignore_eos=True)), timeout=120)
    chunks = [next(stream)]
    reader = threading.Thread(target=lambda: chunks.extend(stream))
    reader.start()
    terminate()
    time.sleep(0.3)
    try:
        stub.Generate(pb.GenerateRequest(text="Hi", stopping=pb.StoppingParams(max_tokens=2)), timeout=10)
        sys.exit("a request during the drain was served")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e
    reader.join(timeout=120)
    assert chunks[-1].finish_reason == pb.LENGTH and sum(len(c.token_ids) for c in chunks) == tokens, chunks[-1]
    code = wait_exit()
    assert code == 0, f"the server exited {code}"
    print(f"drain: the running stream finished its {tokens} tokens, a new request was UNAVAILABLE, exit code 0")


def main():
    address, container, http_url = sys.argv[1], sys.argv[2], sys.argv[3]
    stub = pb_grpc.InferenceStub(grpc.insecure_channel(address))
    greedy = pb.SamplingParams(temperature=0)
    r = stub.Generate(pb.GenerateRequest(text="The capital of France is", sampling=greedy,
                                         stopping=pb.StoppingParams(max_tokens=8)), timeout=60)
    assert r.usage.completion_tokens > 0 and r.text, r
    chat = stub.Generate(pb.GenerateRequest(
        messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="What is the capital of Germany?")]),
        sampling=greedy, stopping=pb.StoppingParams(max_tokens=24)), timeout=60)
    assert "Berlin" in chat.text, chat.text
    print(f"generate: {r.text!r}; chat: {chat.text!r}")
    import openai
    sdk = openai.OpenAI(base_url=http_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    answer = sdk.chat.completions.create(model=sdk.models.list().data[0].id, temperature=0, max_tokens=24,
                                         messages=[{"role": "user", "content": "What is the capital of Germany?"}])
    assert answer.choices[0].message.content == chat.text, (answer, chat.text)
    print(f"OpenAI HTTP chat: {answer.choices[0].message.content!r} (the same as gRPC's)")
    check_drain(
        stub,
        lambda: subprocess.run(["podman", "kill", "--signal", "TERM", container], check=True, capture_output=True),
        lambda: int(subprocess.run(["podman", "wait", container], check=True, capture_output=True,
                                   text=True).stdout.strip()))


if __name__ == "__main__":
    main()
