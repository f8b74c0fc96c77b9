"""Chat messages through the real server: rendered with the model's template, stopped at end of turn."""
import json
import os
import shutil
import subprocess

import grpc
import pytest

from conftest import INFERD_BIN, SMOLLM2, SMOLLM2_BACKEND, SOURCE_DIR, Server, inferd_pb2 as pb


def chat(*turns, max_tokens=48):
    r = pb.GenerateRequest(sampling=pb.SamplingParams(temperature=0), stopping=pb.StoppingParams(max_tokens=max_tokens))
    for role, content in turns:
        r.messages.messages.add(role=role, content=content)
    return r


@pytest.fixture(scope="module")
def smollm2():
    assert os.path.exists(SMOLLM2), "bash scripts/setup.sh fetches the bundled model"
    s = Server(model=SMOLLM2, engine={"backend": SMOLLM2_BACKEND, "block_size": 16, "cpu_kv_cache_gib": 0.25,
                                      "gpu_memory_utilization": 0.2})
    assert s.stub.GetServerInfo(pb.GetServerInfoRequest()).backend == SMOLLM2_BACKEND
    yield s
    assert s.stop() == 0


def test_bundled_smollm2_answers_a_chat_question(smollm2):
    r = smollm2.stub.Generate(chat(("user", "What is the capital of France?")))
    assert "Paris" in r.text
    assert r.finish_reason == pb.EOS  # <|im_end|> ends the turn before max_tokens
    # The prompt is the template's rendering: system turn added, assistant turn opened.
    t = smollm2.stub.Tokenize(pb.TokenizeRequest(
        text="<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
             "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False))
    assert r.usage.prompt_tokens == len(t.token_ids)


def test_chat_equals_the_same_prompt_sent_as_text(smollm2):
    by_chat = smollm2.stub.Generate(chat(("system", "Answer briefly."), ("user", "Name a color."), max_tokens=12))
    text = ("<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nName a color.<|im_end|>\n"
            "<|im_start|>assistant\n")
    by_text = smollm2.stub.Generate(pb.GenerateRequest(
        text=text, sampling=pb.SamplingParams(temperature=0), stopping=pb.StoppingParams(max_tokens=12),
        output=pb.OutputOptions(add_special_tokens=False)))
    assert list(by_chat.token_ids) == list(by_text.token_ids) and by_chat.text == by_text.text


def test_template_refusal_and_empty_messages_are_invalid_argument():
    s = Server(model="llama2-tiny")
    try:
        with pytest.raises(grpc.RpcError) as e:
            s.stub.Generate(chat(("user", "a"), ("user", "b")))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "roles must alternate" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            s.stub.Generate(pb.GenerateRequest(messages=pb.ChatMessages()))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "messages" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            s.stub.Generate(chat(("", "no role")))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "messages[0].role" in e.value.details()
        ok = s.stub.Generate(chat(("user", "a"), ("assistant", "b"), ("user", "c"), max_tokens=4))
        assert ok.usage.completion_tokens == 4 and ok.usage.prompt_tokens > 10
    finally:
        assert s.stop() == 0


def mistral_with_template(tmp_path, template):
    """A copy of mistral-tiny whose tokenizer_config.json carries `template` (None: no template)."""
    d = tmp_path / "model"
    shutil.copytree(os.path.join(SOURCE_DIR, "tests", "fixtures", "models", "mistral-tiny"), d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("chat_template")
    if template is not None:
        cfg["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def test_model_without_a_chat_template_refuses_messages(tmp_path):
    s = Server(model=str(mistral_with_template(tmp_path, None)))
    try:
        with pytest.raises(grpc.RpcError) as e:
            s.stub.Generate(chat(("user", "hi")))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "no chat template" in e.value.details()
        assert s.stub.Generate(pb.GenerateRequest(text="hi", stopping=pb.StoppingParams(max_tokens=2))).usage.completion_tokens == 2
    finally:
        assert s.stop() == 0


def test_a_template_that_does_not_parse_stops_start_up(tmp_path):
    d = mistral_with_template(tmp_path, "{% for m in messages %}{{ m.content }}\n{% macro f() %}{% endmacro %}{% endfor %}")
    conf = tmp_path / "c.yaml"
    conf.write_text(f"model: {{path: {d}}}\n")
    r = subprocess.run([INFERD_BIN, "--config", str(conf), "--listen", "127.0.0.1:0", "--metrics-listen", ""],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "chat template line 2" in r.stderr and "macro" in r.stderr
