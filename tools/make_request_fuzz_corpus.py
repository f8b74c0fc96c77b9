"""Writes the seed corpora of the request fuzzers (tests/fuzz/corpus/{http_request,openai_request,grpc_request,
chat_template}): well-formed requests of every route and field, and the hostile shapes the HTTP battery tries, so
that fuzzing starts from inputs that reach deep into the parsers.

    .venv/bin/python tools/make_request_fuzz_corpus.py
"""
import json
import os
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def write(target, name, data):
    os.makedirs(os.path.join(CORPUS, target), exist_ok=True)
    with open(os.path.join(CORPUS, target, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi {{ 7*7 }}"}],
        "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": ["\n", "END"], "logprobs": True,
        "top_logprobs": 2, "stream": True, "stream_options": {"include_usage": True}}
COMPLETION = {"prompt": ["The capital of", [1, 2, 3]], "max_tokens": 4, "n": 2, "echo": True, "logprobs": 1,
              "logit_bias": {"5": -100}, "stop_token_ids": [7], "min_tokens": 1, "ignore_eos": True}
BODIES = {
    "chat": (1, CHAT),
    "chat_parts": (1, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}),
    "completion": (0, COMPLETION),
    "completion_ids": (0, {"prompt": [9, 8, 7], "max_completion_tokens": 3, "priority": -2, "speculative": False}),
    "nested": (1, {"messages": [[[[[]]]]]}),
    "unknown_field": (1, {"messages": [{"role": "user", "content": "x"}], "no_stop_trim": True}),
}


def http(method, target, body=b"", headers=None):
    lines = [f"{method} {target} HTTP/1.1", "Host: localhost"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body and not any(k.lower() == "transfer-encoding" for k in (headers or {})):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def main():
    for name, (route, body) in BODIES.items():
        write("openai_request", name, bytes([route]) + json.dumps(body).encode())
    write("openai_request", "trailing_nul", b"\x01" + json.dumps(CHAT).encode() + b"\x00garbage")

    chat = json.dumps(CHAT).encode()
    js = {"Content-Type": "application/json"}
    write("http_request", "chat", http("POST", "/v1/chat/completions", chat, js))
    write("http_request", "completion", http("POST", "/v1/completions", json.dumps(COMPLETION).encode(), js))
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chat[i:i + 40]), chat[i:i + 40]) for i in range(0, len(chat), 40))
    write("http_request", "chunked", http("POST", "/v1/chat/completions", chunks + b"0\r\n\r\n",
                                          {**js, "Transfer-Encoding": "chunked"}))
    write("http_request", "te_and_cl", http("POST", "/v1/completions", b"{}",
                                            {**js, "Transfer-Encoding": "gzip", "Content-Length": "2"}))
    write("http_request", "expect", http("POST", "/v1/completions", b'{"prompt":"a"}', {**js, "Expect": "100-continue"}))
    write("http_request", "head", http("HEAD", "/health"))
    write("http_request", "absolute", http("GET", "http://localhost:8000/v1/models?x=1"))
    write("http_request", "pipelined", http("GET", "/health") + http("GET", "/v1/models"))
    write("http_request", "two_hosts", b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
    write("http_request", "bare_lf", b"POST /v1/completions HTTP/1.1\nHost: a\nTransfer-Encoding: chunked\n\n2\n{}\n0\n\n")

    sys.path.insert(0, tempfile.mkdtemp())
    from grpc_tools import protoc
    assert protoc.main(["protoc", f"-I{ROOT}/proto", f"--python_out={sys.path[0]}",
                        f"{ROOT}/proto/inferd/v1/inferd.proto"]) == 0
    from inferd.v1 import inferd_pb2 as pb
    requests = {
        "text": pb.GenerateRequest(text="The capital of France is", sampling=pb.SamplingParams(temperature=0.5, seed=1),
                                   stopping=pb.StoppingParams(max_tokens=8, stop=["\n"])),
        "ids": pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 2, 3, 300000]), priority=3, no_speculation=True),
        "messages": pb.GenerateRequest(messages=pb.ChatMessages(messages=[
            pb.ChatMessage(role="system", content="s"), pb.ChatMessage(role="user", content="{% raw %}u")])),
    }
    for name, r in requests.items():
        for template in (0, 1, 3):
            write("grpc_request", f"{name}_{template}", bytes([template]) + r.SerializeToString())

    for t in range(12):
        msgs = [b"\x00You are {{ bos_token }}.", b"\x01Hello\xff\x02Hi!", b"\x01{% for x in range(9) %}x{% endfor %}"]
        write("chat_template", f"t{t}", bytes([t | (0x80 if t % 2 else 0)]) + b"\xff".join(msgs))
    write("chat_template", "invalid_utf8", b"\x01\x01\xc3\x28\xff\x02\xed\xa0\x80")


if __name__ == "__main__":
    main()
