"""engine.plan_ahead through the real server: with each step planned while the one before it runs (a
sequence decodes its last token before the host has it), every request gets exactly what it gets with
steps planned one after another — greedy and seeded tokens, stop strings and stop tokens cut at the same
place, penalties, min_tokens, logprobs, usage — and every block comes back, cancelled streams included."""
import pytest

from conftest import (Server, assert_half_cancelled_and_every_block_free, cancel_half_of_streams, inferd_pb2 as pb,
                      stream_all, wait_until_idle)

PROMPTS = ["The scheduler batches tokens", "Hello world", "def forward(self, x):", "日本語のテキスト 😀",
           "the model serves requests", "paged cache of blocks", "I'm here, you're there", "1234 5678"]


def requests():
    """A mixed batch: every sampling and stopping option that reads the output so far."""
    out = []
    for i, p in enumerate(PROMPTS):
        out.append(pb.GenerateRequest(text=p, sampling=pb.SamplingParams(temperature=0),
                                      stopping=pb.StoppingParams(max_tokens=1 + 7 * i, ignore_eos=True)))
        out.append(pb.GenerateRequest(text=p, sampling=pb.SamplingParams(temperature=0.8, top_p=0.9, seed=i),
                                      stopping=pb.StoppingParams(max_tokens=30, ignore_eos=True),
                                      output=pb.OutputOptions(top_logprobs=3)))
        out.append(pb.GenerateRequest(text=p, sampling=pb.SamplingParams(temperature=0.7, seed=100 + i,
                                                                         repetition_penalty=1.3,
                                                                         frequency_penalty=0.5),
                                      stopping=pb.StoppingParams(max_tokens=25, min_tokens=20)))
        out.append(pb.GenerateRequest(text=p, sampling=pb.SamplingParams(temperature=0),
                                      stopping=pb.StoppingParams(max_tokens=40, ignore_eos=True,
                                                                 stop=["e", "of"])))
    return out


@pytest.fixture(scope="module")
def servers():
    one_by_one = Server(engine={"plan_ahead": "off"})
    ahead = Server(engine={"plan_ahead": "on"})
    yield one_by_one, ahead
    for s in (one_by_one, ahead):
        assert s.stop() == 0, s.logs()


def test_planned_ahead_every_request_gets_what_it_gets_one_step_at_a_time(servers):
    one_by_one, ahead = servers
    reqs = requests()
    want = stream_all(one_by_one.stub, reqs)
    got = stream_all(ahead.stub, reqs)
    assert "each step is planned while the one before it runs" in ahead.logs()
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g.ids, g.text, g.finish, g.completion) == (w.ids, w.text, w.finish, w.completion), f"request {i}"
        assert g.completion == len(g.ids)
        # Batches of other shapes sum in another order: the values agree to float rounding.
        assert [t for t, _, _ in g.logprobs] == [t for t, _, _ in w.logprobs], f"request {i}"
        assert [v for _, v, _ in g.logprobs] == pytest.approx([v for _, v, _ in w.logprobs], abs=2e-3), f"request {i}"
    stops = [want[i].finish for i in range(3, len(reqs), 4)]
    assert pb.STOP_STRING in stops, "the batch exercises stop strings"
    info = wait_until_idle(ahead.stub)
    assert info.running_requests == 0 and info.free_kv_blocks == info.total_kv_blocks > 0


def test_planned_ahead_cancelling_half_of_the_streams_frees_every_block(servers):
    _, ahead = servers
    reqs = [pb.GenerateRequest(text=PROMPTS[i % len(PROMPTS)], sampling=pb.SamplingParams(temperature=0),
                               stopping=pb.StoppingParams(max_tokens=120, ignore_eos=True)) for i in range(24)]
    done, errors = cancel_half_of_streams(ahead.stub, reqs)
    assert_half_cancelled_and_every_block_free(ahead.stub, done, errors, 24, 120)
