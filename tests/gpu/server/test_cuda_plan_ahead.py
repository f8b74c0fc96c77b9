"""engine.plan_ahead on the cuda backend (scripts/gpu_run.sh runs it): penalties, bans before min_tokens, stop
strings and logprobs with steps planned ahead, against the same requests with steps planned one by one. The cpu
suite (tests/integration/test_plan_ahead.py) checks the engine's side on the host; this one the device's: the
sampler's penalty entries and bans, the embedding of pending tokens, the decode graphs. bf16 rounding differs by
batch shape, so tokens are compared up to the first position whose top-2 logprob margin is under 0.05."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "integration"))
from conftest import Server, inferd_pb2 as pb, stream_all, wait_until_idle  # noqa: E402

MODELS = os.environ.get("INFERD_GPU_MODELS", "")
pytestmark = pytest.mark.skipif(not MODELS, reason="INFERD_GPU_MODELS is not set (scripts/gpu_run.sh sets it)")
PROMPTS = ["The scheduler batches tokens", "Hello world", "def forward(self, x):", "日本語のテキスト 😀",
           "the model serves requests", "paged cache of blocks", "I'm here, you're there", "1234 5678"]


def requests():
    out = []
    for i, p in enumerate(PROMPTS):
        top = pb.OutputOptions(top_logprobs=2)
        out.append(pb.GenerateRequest(text=p, sampling=pb.SamplingParams(temperature=0, repetition_penalty=1.5,
                                                                         frequency_penalty=0.5, presence_penalty=0.3),
                                      stopping=pb.StoppingParams(max_tokens=24, ignore_eos=True), output=top))
        out.append(pb.GenerateRequest(text=p, sampling=pb.SamplingParams(temperature=0),
                                      stopping=pb.StoppingParams(max_tokens=20 + i, min_tokens=12 + i,
                                                                 stop_token_ids=list(range(3, 640, 7))),
                                      output=top))
        out.append(pb.GenerateRequest(text=p, sampling=pb.SamplingParams(temperature=0),
                                      stopping=pb.StoppingParams(max_tokens=32, ignore_eos=True, stop=["e", "th"]),
                                      output=top))
        out.append(pb.GenerateRequest(text=p, sampling=pb.SamplingParams(temperature=0),
                                      stopping=pb.StoppingParams(max_tokens=1 + 5 * i, ignore_eos=True), output=top))
    return out


@pytest.fixture(scope="module")
def servers():
    common = {"backend": "cuda", "gpu_memory_utilization": 0.2}
    model = os.path.join(MODELS, "llama3-hd64")
    sched = {"max_num_seqs": 32, "max_num_batched_tokens": 256}
    one_by_one = Server(model=model, engine={**common, "plan_ahead": "off"}, scheduler=sched)
    ahead = Server(model=model, engine={**common, "plan_ahead": "on"}, scheduler=sched)
    yield one_by_one, ahead
    for s in (one_by_one, ahead):
        assert s.stop() == 0, s.logs()


def test_planned_ahead_on_cuda_penalties_bans_and_stop_strings_act_as_one_step_at_a_time(servers):
    one_by_one, ahead = servers
    reqs = requests()
    want = stream_all(one_by_one.stub, reqs)
    got = stream_all(ahead.stub, reqs)
    assert "each step is planned while the one before it runs" in ahead.logs()
    compared = 0
    for i, req in enumerate(reqs):
        g, w = got[i], want[i]
        ids, text = g.ids, g.text
        assert g.completion == len(ids), f"request {i}: usage counts the tokens sent"
        margins = [top[0][1] - top[1][1] for _, _, top in w.logprobs]
        first = next((k for k in range(min(len(ids), len(w.ids))) if ids[k] != w.ids[k]), None)
        if first is not None:
            assert margins[first] < 0.05, f"request {i} leaves the one-by-one run at {first} (margin {margins[first]})"
            continue
        compared += 1
        assert (ids, text, g.finish) == (w.ids, w.text, w.finish), f"request {i}"
        # What each option promises, whatever the numerics.
        if req.stopping.min_tokens:
            stops = set(req.stopping.stop_token_ids)
            assert not stops & set(ids[:req.stopping.min_tokens - 1]), f"request {i}: a stop id before min_tokens"
        if req.stopping.stop:
            assert not any(s in text for s in req.stopping.stop), f"request {i}: {text!r}"
        if req.sampling.repetition_penalty > 1:
            assert len(set(ids)) >= len(ids) * 2 // 3, f"request {i} repeats despite its penalties: {ids}"
    assert compared >= len(reqs) * 3 // 4, f"only {compared} of {len(reqs)} requests compared in full"
    assert pb.STOP_STRING in [want[i].finish for i in range(2, len(reqs), 4)], "the batch exercises stop strings"
    assert pb.STOP_TOKEN in [want[i].finish for i in range(1, len(reqs), 4)], "the batch exercises stop ids"
    info = wait_until_idle(ahead.stub)
    assert info.running_requests == 0 and info.free_kv_blocks == info.total_kv_blocks > 0
