"""`inferd-bench perplexity` against the real server on the bundled SmolLM2 (cpu): the King James text it measures
accuracy on is predicted far better than the same words shuffled, and the tool's per-window sums are what a plain
gRPC client gets from the same windows' prompt logprobs."""
import json
import os
import random
import subprocess

import pytest

from conftest import SOURCE_DIR, Server, inferd_pb2 as pb
from test_chat import SMOLLM2

BENCH = os.environ.get("INFERD_BENCH", os.path.join(SOURCE_DIR, "build", "tools", "inferd-bench"))
TEXT = os.path.join(SOURCE_DIR, "models", "eval", "kjv-genesis-exodus.txt")
WINDOW = 128


@pytest.fixture(scope="module")
def smollm2():
    assert os.path.exists(SMOLLM2) and os.path.exists(TEXT), "bash scripts/setup.sh fetches the model and the text"
    s = Server(model=SMOLLM2, engine={"backend": "cpu", "block_size": 16, "cpu_kv_cache_gib": 0.25})
    yield s
    assert s.stop() == 0


def perplexity(server, path, tmp_path, windows=2):
    out = tmp_path / (os.path.basename(path) + ".json")
    run = subprocess.run([BENCH, "perplexity", path, "--address", server.address, "--window", str(WINDOW),
                          "--max-windows", str(windows), "--json", str(out)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    assert "perplexity" in run.stdout
    return json.load(open(out))


def test_the_text_is_predicted_and_shuffled_words_are_not(smollm2, tmp_path):
    text = perplexity(smollm2, TEXT, tmp_path)
    assert text["windows"] == 2 and text["tokens_scored"] == 2 * (WINDOW - 1)
    words = open(TEXT).read()[:20000].split()
    random.Random(0).shuffle(words)
    shuffled = tmp_path / "shuffled.txt"
    shuffled.write_text(" ".join(words))
    noise = perplexity(smollm2, str(shuffled), tmp_path)
    # A scoring row off by one position would make both about equally bad.
    assert 1 < text["perplexity"] < 40, text
    assert noise["perplexity"] > 5 * text["perplexity"], (text["perplexity"], noise["perplexity"])


def test_window_sums_are_the_prompt_logprobs_a_client_gets(smollm2, tmp_path):
    report = perplexity(smollm2, TEXT, tmp_path, windows=1)
    # The tool tokenizes in paragraph-aligned pieces without special tokens; the first piece holds the window.
    ids = list(smollm2.stub.Tokenize(pb.TokenizeRequest(text=open(TEXT).read()[:4000], add_special_tokens=False))
               .token_ids)[:WINDOW]
    req = pb.GenerateRequest(sampling=pb.SamplingParams(temperature=0),
                             stopping=pb.StoppingParams(max_tokens=1, ignore_eos=True),
                             output=pb.OutputOptions(prompt_logprobs=0))
    req.token_ids.ids.extend(ids)
    r = smollm2.stub.Generate(req)
    assert len(r.prompt_logprobs) == WINDOW - 1
    assert abs(-sum(lp.logprob for lp in r.prompt_logprobs) - report["window_nll"][0]) < 1e-2
