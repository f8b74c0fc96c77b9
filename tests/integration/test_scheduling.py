"""The scheduler under pressure, through the real server: a deliberately tiny KV pool, preemption, priorities,
admission bounds, prefix reuse. Outputs must not depend on scheduling; no block may leak."""
import os
import random
import threading
import time

import grpc
import pytest

from conftest import (SOURCE_DIR, Server, cancel_half_of_streams, evict_prefix_to_host_and_ask_again, inferd_pb2 as pb,
                      wait_until_idle)

TINY_POOL = {"backend": "cpu", "block_size": 16, "num_blocks": 24}  # 384 tokens in all


def greedy(text, max_tokens, priority=0):
    return pb.GenerateRequest(text=text, priority=priority, sampling=pb.SamplingParams(temperature=0),
                              stopping=pb.StoppingParams(max_tokens=max_tokens, ignore_eos=True))


def info(s):
    return s.stub.GetServerInfo(pb.GetServerInfoRequest())


def test_64_concurrent_requests_on_a_tiny_pool_preempt_and_still_equal_their_solo_runs():
    s = Server(engine=TINY_POOL)
    try:
        requests = [greedy(f"request {i}: tell me about block {i * 7}", max_tokens=40) for i in range(64)]
        solo = [list(s.stub.Generate(r).token_ids) for r in requests]
        assert info(s).preemptions_total == 0, "one at a time, nothing is preempted"
        futures = [s.stub.Generate.future(r) for r in requests]
        together = [list(f.result(timeout=300).token_ids) for f in futures]
        assert together == solo
        i = wait_until_idle(s.stub)
        assert i.preemptions_total > 0, "64 requests of 4 blocks each cannot share 24 blocks without preemption"
        assert i.preempted_tokens_total > 0
        assert i.running_requests == 0 and i.free_kv_blocks == i.total_kv_blocks == 24
        assert "preempted" in s.logs(), "every preemption is logged"
    finally:
        assert s.stop() == 0


# The float32 KV cache, and a float16 one, whose blocks go to host memory and back as they are.
@pytest.mark.parametrize("kv_cache_dtype", ["float32", "float16"])
def test_with_swap_space_preempted_requests_resume_from_host_memory_with_the_same_outputs(kv_cache_dtype):
    s = Server(engine={**TINY_POOL, "swap_space_gib": 0.01, "kv_cache_dtype": kv_cache_dtype})
    try:
        requests = [greedy(f"request {i}: tell me about block {i * 7}", max_tokens=40) for i in range(64)]
        solo = [list(s.stub.Generate(r).token_ids) for r in requests]
        futures = [s.stub.Generate.future(r) for r in requests]
        together = [list(f.result(timeout=300).token_ids) for f in futures]
        assert together == solo
        i = wait_until_idle(s.stub)
        assert i.swapped_preemptions_total > 0, "preemptions went to swap space"
        assert i.preempted_tokens_total < 40 * i.preemptions_total
        assert i.running_requests == 0 and i.free_kv_blocks == i.total_kv_blocks
        assert "swapped out to host memory" in s.logs()
    finally:
        assert s.stop() == 0


def test_cancelling_half_of_the_streams_at_random_points_on_a_tiny_pool_returns_every_block():
    s = Server(engine=TINY_POOL)
    try:
        rng = random.Random(7)
        requests = [greedy(f"stream {i} " * rng.randint(1, 12), max_tokens=rng.randint(8, 60)) for i in range(32)]
        done, errors = cancel_half_of_streams(s.stub, requests)
        assert not errors, errors
        assert len(done) == 32
        i = wait_until_idle(s.stub)
        assert i.running_requests == 0 and i.waiting_requests == 0
        assert i.free_kv_blocks == i.total_kv_blocks, "every block is back (free or cached)"
        assert i.used_kv_blocks == 0
    finally:
        assert s.stop() == 0


def test_a_repeated_long_prompt_reports_cached_tokens_and_a_lower_time_to_first_token():
    s = Server(scheduler={"max_num_batched_tokens": 128})
    try:
        prompt = " ".join(f"fact {i} about paged attention and its blocks" for i in range(22))
        first = s.stub.Generate(greedy(prompt, max_tokens=4))
        second = s.stub.Generate(greedy(prompt, max_tokens=4))
        n = first.usage.prompt_tokens
        assert n > 256, n  # several steps of 128 tokens the first time
        assert first.usage.cached_prompt_tokens == 0
        assert second.usage.cached_prompt_tokens == (n - 1) // 16 * 16
        assert list(second.token_ids) == list(first.token_ids)
        assert second.timing.time_to_first_token_s < first.timing.time_to_first_token_s
        i = info(s)
        assert i.prefix_cache_hit_tokens == second.usage.cached_prompt_tokens
        assert i.prefix_cache_query_tokens == 2 * n
        assert abs(i.prefix_cache_hit_rate - i.prefix_cache_hit_tokens / (2 * n)) < 1e-9
        assert i.cached_kv_blocks > 0
    finally:
        assert s.stop() == 0


def test_the_queued_token_bound_is_resource_exhausted_naming_it():
    s = Server(scheduler={"max_num_seqs": 1, "max_num_batched_tokens": 64, "max_queued_tokens": 100})
    try:
        running = s.stub.GenerateStream(greedy("Hello", max_tokens=480))
        next(running)  # it holds the only seat
        sixty = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5] * 60), sampling=pb.SamplingParams(temperature=0),
                                   stopping=pb.StoppingParams(max_tokens=1))
        queued = s.stub.Generate.future(sixty)
        end = time.time() + 10
        while info(s).waiting_requests < 1 and time.time() < end:
            time.sleep(0.01)
        try:
            s.stub.Generate(sixty)
            raise AssertionError("120 queued prompt tokens passed a bound of 100")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "scheduler.max_queued_tokens = 100" in e.details(), e.details()
        running.cancel()
        assert queued.result(timeout=60).usage.prompt_tokens == 60
    finally:
        assert s.stop() == 0


def test_a_request_the_pool_can_never_hold_is_refused_at_once():
    s = Server(engine=TINY_POOL)
    try:
        assert s.stub.GetModelInfo(pb.GetModelInfoRequest()).max_model_len == 384, "capped by the pool"
        t0 = time.monotonic()
        try:
            s.stub.Generate(greedy("Hello there", max_tokens=380), timeout=10)
            raise AssertionError("a request longer than the whole pool was accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "max_model_len = 384" in e.details(), e.details()
        assert time.monotonic() - t0 < 2
    finally:
        assert s.stop() == 0


def test_a_high_priority_request_overtakes_a_queue_of_low_ones():
    s = Server(scheduler={"max_num_seqs": 1, "max_num_batched_tokens": 64})
    try:
        high = greedy("an urgent question", max_tokens=16, priority=10)
        solo_high = list(s.stub.Generate(high).token_ids)
        lows = [greedy(f"a patient question {i}", max_tokens=200) for i in range(4)]
        solo_lows = [list(s.stub.Generate(r).token_ids) for r in lows]
        finished = {}

        def run(name, request):
            finished[name] = (list(s.stub.Generate(request, timeout=300).token_ids), time.monotonic())

        threads = [threading.Thread(target=run, args=(f"low{i}", r)) for i, r in enumerate(lows)]
        for t in threads:
            t.start()
        end = time.time() + 10
        while time.time() < end:
            i = info(s)
            if i.running_requests == 1 and i.waiting_requests == 3:
                break  # one low runs, three wait
            time.sleep(0.005)
        assert i.running_requests == 1 and i.waiting_requests == 3, i
        t = threading.Thread(target=run, args=("high", high))
        t.start()
        for th in threads + [t]:
            th.join(timeout=300)
        assert finished["high"][0] == solo_high
        for i in range(4):
            assert finished[f"low{i}"][0] == solo_lows[i], "preempted or not, a greedy output is the same"
            assert finished["high"][1] < finished[f"low{i}"][1], f"low{i} finished before the high one"
        assert info(s).preemptions_total >= 1, "the high one took the seat of a running low one"
    finally:
        assert s.stop() == 0


def test_a_long_prompt_does_not_hold_back_a_newcomers_first_token():
    # The bundled SmolLM2 (slow enough on the cpu that a long prefill takes many steps): a ~400-token prompt in
    # 32-token steps, capped at 8 tokens per step while others wait. A short request arriving during that
    # prefill gets its first token within a step or two, long before the long prompt does.
    model = os.path.join(SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    s = Server(model=model, engine={"backend": "cpu", "cpu_kv_cache_gib": 0.25},
               scheduler={"max_num_seqs": 8, "max_num_batched_tokens": 32, "long_prefill_chunk": 8})
    try:
        long_prompt = " ".join(f"item {i} is on shelf {i % 7}" for i in range(60))
        firsts = {}

        def first_token(name, request):
            t0 = time.monotonic()
            for chunk in s.stub.GenerateStream(request, timeout=600):
                if chunk.token_ids:
                    firsts[name] = time.monotonic() - t0
                    return

        long_thread = threading.Thread(target=first_token, args=("long", greedy(long_prompt, max_tokens=2)))
        long_thread.start()
        end = time.time() + 30
        while info(s).running_requests < 1 and time.time() < end:
            time.sleep(0.01)
        first_token("short", greedy("Hi", max_tokens=2))
        long_thread.join(timeout=600)
        assert set(firsts) == {"short", "long"}, firsts
        assert firsts["short"] < 0.3 * firsts["long"], firsts
    finally:
        assert s.stop() == 0


def test_a_prefix_evicted_from_the_device_comes_back_from_the_host_tier_with_the_same_outputs():
    s = Server(engine={**TINY_POOL, "host_kv_cache_gib": 0.01})
    try:
        first, again, before, after = evict_prefix_to_host_and_ask_again(s.stub, greedy)
        assert before.host_kv_blocks > 0 and before.host_cached_kv_blocks > 0
        assert before.kv_copied_to_host_bytes > 0, "evicted prefix blocks were written back"
        assert list(again.token_ids) == list(first.token_ids)
        restored = after.host_prefix_cache_hit_tokens - before.host_prefix_cache_hit_tokens
        assert restored >= 16 and restored % 16 == 0, "whole blocks of the prompt came back from the host tier"
        assert again.usage.cached_prompt_tokens >= restored
        assert after.kv_copied_to_device_bytes > before.kv_copied_to_device_bytes
        assert after.free_kv_blocks == after.total_kv_blocks, "no block leaked"
        assert after.host_swapped_kv_blocks == 0
    finally:
        assert s.stop() == 0


def test_outputs_after_host_tier_restores_and_swap_ins_equal_those_of_a_server_with_the_cache_off():
    # Long shared preambles (several blocks each) with distinct questions, 32 at once on the tiny pool, twice: the
    # crowd swaps requests out and in, and the second round finds the preambles evicted from the device and
    # restores them from the host tier. Every greedy output equals that of the same request on a server with no
    # prefix cache, no swap space and no host tier (fp32, exact).
    preambles = [" ".join(f"rule {k}.{j} of the house" for j in range(10 + 3 * k)) for k in range(4)]
    requests = [greedy(f"{preambles[i % 4]} question {i}: which rule?", max_tokens=24) for i in range(32)]
    plain = Server(engine=TINY_POOL, scheduler={"prefix_caching": False})
    try:
        expected = [list(plain.stub.Generate(r).token_ids) for r in requests]
    finally:
        assert plain.stop() == 0
    s = Server(engine={**TINY_POOL, "swap_space_gib": 0.01, "host_kv_cache_gib": 0.01})
    try:
        for _ in range(2):
            futures = [s.stub.Generate.future(r) for r in requests]
            assert [list(f.result(timeout=300).token_ids) for f in futures] == expected
        i = wait_until_idle(s.stub)
        assert i.swapped_preemptions_total > 0, "the crowd swapped requests out and back in"
        assert i.host_prefix_cache_hit_tokens > 0, "preambles came back from the host tier"
        assert i.free_kv_blocks == i.total_kv_blocks and i.host_swapped_kv_blocks == 0
    finally:
        assert s.stop() == 0


def test_a_model_split_over_four_shards_serves_the_greedy_tokens_of_the_whole_one():
    # engine.tensor_parallel_size on the cpu backend: 4 shards on threads (the 2 KV heads of llama3-tiny replicated).
    requests = [greedy(f"shard test {i}: " + " ".join(f"w{j * i}" for j in range(3 + 5 * i)), max_tokens=16)
                for i in range(8)]
    outputs = {}
    for n in (1, 4):
        s = Server(engine={**TINY_POOL, "tensor_parallel_size": n})
        try:
            futures = [s.stub.Generate.future(r) for r in requests]
            outputs[n] = [list(f.result(timeout=300).token_ids) for f in futures]
            if n == 4:
                assert "tensor_parallel_size: 4" in s.logs()
        finally:
            assert s.stop() == 0
    assert outputs[4] == outputs[1]
